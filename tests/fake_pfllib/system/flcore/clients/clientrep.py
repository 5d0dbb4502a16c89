# Test fixture: FedRep's client: head epochs with the base frozen, then base epochs with the head
# frozen; receives only the base (set_parameters copies into model.base).
import time

from flcore.clients.clientbase import Client, PlainSGD


class clientRep(Client):
    def __init__(self, args, id, train_samples, test_samples, **kwargs):
        super().__init__(args, id, train_samples, test_samples, **kwargs)
        self.optimizer = PlainSGD(self.model.base.parameters(), lr=self.learning_rate)
        self.optimizer_per = PlainSGD(self.model.head.parameters(), lr=self.learning_rate)
        self.plocal_epochs = args.plocal_epochs

    def _epochs(self, loader, epochs, optimizer, train_base):
        for param in self.model.base.parameters():
            param.requires_grad = train_base
        for param in self.model.head.parameters():
            param.requires_grad = not train_base
        for _ in range(epochs):
            for x, y in loader:
                loss = self.loss(self.model(x.to(self.device)), y.to(self.device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

    def train(self):
        trainloader = self.load_train_data()
        self.model.train()
        start_time = time.time()
        self._epochs(trainloader, self.plocal_epochs, self.optimizer_per, train_base=False)
        self._epochs(trainloader, self.local_epochs, self.optimizer, train_base=True)
        self.train_time_cost['num_rounds'] += 1
        self.train_time_cost['total_cost'] += time.time() - start_time

    def set_parameters(self, base):
        for new_param, old_param in zip(base.parameters(), self.model.base.parameters()):
            old_param.data = new_param.data.clone()
