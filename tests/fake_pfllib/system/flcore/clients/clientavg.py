# Test fixture: plain local SGD, as PFLlib's clientavg.py does.
import time

from flcore.clients.clientbase import Client


class clientAVG(Client):
    def __init__(self, args, id, train_samples, test_samples, **kwargs):
        super().__init__(args, id, train_samples, test_samples, **kwargs)

    def train(self):
        trainloader = self.load_train_data()
        self.model.train()
        start_time = time.time()
        for epoch in range(self.local_epochs):
            for x, y in trainloader:
                output = self.model(x.to(self.device))
                loss = self.loss(output, y.to(self.device))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.train_time_cost['num_rounds'] += 1
        self.train_time_cost['total_cost'] += time.time() - start_time
