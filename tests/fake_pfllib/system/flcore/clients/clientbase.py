# Test fixture: the Client contracts of PFLlib's clientbase.py as described in PFLLIB.md section 3.
# (PlainSGD stands in for torch.optim.SGD, whose constructor imports torch._dynamo: seconds per run.)
import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from utils.data_utils import read_client_data


class PlainSGD(object):
    def __init__(self, params, lr):
        self.params = list(params)
        self.lr = lr
        self.param_groups = [{"params": self.params, "lr": lr}]  # what callers read of an optimiser

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


class Client(object):
    def __init__(self, args, id, train_samples, test_samples, **kwargs):
        torch.manual_seed(0)
        self.model = copy.deepcopy(args.model)
        self.algorithm = args.algorithm
        self.dataset = args.dataset
        self.device = args.device
        self.id = id
        self.num_classes = args.num_classes
        self.train_samples = train_samples
        self.test_samples = test_samples
        self.batch_size = args.batch_size
        self.learning_rate = args.local_learning_rate
        self.local_epochs = args.local_epochs
        self.train_slow = kwargs['train_slow']
        self.send_slow = kwargs['send_slow']
        self.train_time_cost = {'num_rounds': 0, 'total_cost': 0.0}
        self.send_time_cost = {'num_rounds': 0, 'total_cost': 0.0}
        self.loss = nn.CrossEntropyLoss()
        self.optimizer = PlainSGD(self.model.parameters(), lr=self.learning_rate)

    def load_train_data(self, batch_size=None):
        train_data = read_client_data(self.dataset, self.id, is_train=True)
        return DataLoader(train_data, batch_size or self.batch_size, drop_last=True, shuffle=True)

    def load_test_data(self, batch_size=None):
        test_data = read_client_data(self.dataset, self.id, is_train=False)
        return DataLoader(test_data, batch_size or self.batch_size, drop_last=False, shuffle=True)

    def set_parameters(self, model):
        for new_param, old_param in zip(model.parameters(), self.model.parameters()):
            old_param.data = new_param.data.clone()

    def test_metrics(self):
        self.model.eval()
        test_acc, test_num = 0, 0
        with torch.no_grad():
            for x, y in self.load_test_data():
                output = self.model(x.to(self.device))
                test_acc += (torch.argmax(output, dim=1) == y.to(self.device)).sum().item()
                test_num += y.shape[0]
        return test_acc, test_num

    def train_metrics(self):
        self.model.eval()
        train_num, losses = 0, 0
        with torch.no_grad():
            for x, y in self.load_train_data():
                loss = self.loss(self.model(x.to(self.device)), y.to(self.device))
                train_num += y.shape[0]
                losses += loss.item() * y.shape[0]
        return losses, train_num
