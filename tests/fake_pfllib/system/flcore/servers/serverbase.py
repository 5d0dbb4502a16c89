# Test fixture: the Server contracts of PFLlib's serverbase.py as described in PFLLIB.md section 2.
import copy
import os
import random
import time

import h5py
import numpy as np

from utils.data_utils import read_client_data


class Server(object):
    def __init__(self, args, times):
        self.args = args
        self.device = args.device
        self.dataset = args.dataset
        self.num_classes = args.num_classes
        self.global_rounds = args.global_rounds
        self.local_epochs = args.local_epochs
        self.batch_size = args.batch_size
        self.learning_rate = args.local_learning_rate
        self.global_model = copy.deepcopy(args.model)
        self.num_clients = args.num_clients
        self.join_ratio = args.join_ratio
        self.num_join_clients = int(self.num_clients * self.join_ratio)
        self.current_num_join_clients = self.num_join_clients
        self.algorithm = args.algorithm
        self.goal = args.goal
        self.time_threthold = args.time_threthold

        self.clients = []
        self.selected_clients = []
        self.train_slow_clients = []
        self.send_slow_clients = []

        self.uploaded_weights = []
        self.uploaded_ids = []
        self.uploaded_models = []

        self.rs_test_acc = []
        self.rs_test_auc = []
        self.rs_train_loss = []

        self.times = times
        self.eval_gap = args.eval_gap
        self.client_drop_rate = args.client_drop_rate
        self.train_slow_rate = 0.0
        self.send_slow_rate = 0.0

    def set_clients(self, clientObj):
        for i, train_slow, send_slow in zip(range(self.num_clients), self.train_slow_clients,
                                            self.send_slow_clients):
            train_data = read_client_data(self.dataset, i, is_train=True)
            test_data = read_client_data(self.dataset, i, is_train=False)
            client = clientObj(self.args, id=i, train_samples=len(train_data), test_samples=len(test_data),
                               train_slow=train_slow, send_slow=send_slow)
            self.clients.append(client)

    def select_slow_clients(self, slow_rate):
        slow_clients = [False for _ in range(self.num_clients)]
        for i in np.random.choice(range(self.num_clients), int(slow_rate * self.num_clients)):
            slow_clients[i] = True
        return slow_clients

    def set_slow_clients(self):
        self.train_slow_clients = self.select_slow_clients(self.train_slow_rate)
        self.send_slow_clients = self.select_slow_clients(self.send_slow_rate)

    def select_clients(self):
        return list(np.random.choice(self.clients, self.current_num_join_clients, replace=False))

    def send_models(self):
        assert (len(self.clients) > 0)
        for client in self.clients:
            start_time = time.time()
            client.set_parameters(self.global_model)
            client.send_time_cost['num_rounds'] += 1
            client.send_time_cost['total_cost'] += 2 * (time.time() - start_time)

    def receive_models(self):
        assert (len(self.selected_clients) > 0)
        active_clients = random.sample(self.selected_clients,
                                       int((1 - self.client_drop_rate) * self.current_num_join_clients))
        self.uploaded_ids = []
        self.uploaded_weights = []
        self.uploaded_models = []
        tot_samples = 0
        for client in active_clients:
            try:
                client_time_cost = client.train_time_cost['total_cost'] / client.train_time_cost['num_rounds'] + \
                    client.send_time_cost['total_cost'] / client.send_time_cost['num_rounds']
            except ZeroDivisionError:
                client_time_cost = 0
            if client_time_cost <= self.time_threthold:
                tot_samples += client.train_samples
                self.uploaded_ids.append(client.id)
                self.uploaded_weights.append(client.train_samples)
                self.uploaded_models.append(client.model)
        for i, w in enumerate(self.uploaded_weights):
            self.uploaded_weights[i] = w / tot_samples

    def aggregate_parameters(self):
        assert (len(self.uploaded_models) > 0)
        self.global_model = copy.deepcopy(self.uploaded_models[0])
        for param in self.global_model.parameters():
            param.data.zero_()
        for w, client_model in zip(self.uploaded_weights, self.uploaded_models):
            self.add_parameters(w, client_model)

    def add_parameters(self, w, client_model):
        for server_param, client_param in zip(self.global_model.parameters(), client_model.parameters()):
            server_param.data += client_param.data.clone() * w

    def save_results(self):
        algo = self.dataset + "_" + self.algorithm
        result_path = "../results/"
        if not os.path.exists(result_path):
            os.makedirs(result_path)
        if len(self.rs_test_acc):
            algo = algo + "_" + self.goal + "_" + str(self.times)
            file_path = result_path + "{}.h5".format(algo)
            print("File path: " + file_path)
            with h5py.File(file_path, 'w') as hf:
                hf.create_dataset('rs_test_acc', data=self.rs_test_acc)
                hf.create_dataset('rs_test_auc', data=self.rs_test_auc)
                hf.create_dataset('rs_train_loss', data=self.rs_train_loss)

    def test_metrics(self):
        num_samples, tot_correct, ids = [], [], []
        for c in self.clients:
            ct, ns = c.test_metrics()
            tot_correct.append(ct * 1.0)
            num_samples.append(ns)
            ids.append(c.id)
        return ids, num_samples, tot_correct

    def train_metrics(self):
        num_samples, losses, ids = [], [], []
        for c in self.clients:
            cl, ns = c.train_metrics()
            num_samples.append(ns)
            losses.append(cl * 1.0)
            ids.append(c.id)
        return ids, num_samples, losses

    def evaluate(self, acc=None, loss=None):
        stats = self.test_metrics()
        stats_train = self.train_metrics()
        test_acc = sum(stats[2]) * 1.0 / sum(stats[1])
        train_loss = sum(stats_train[2]) * 1.0 / sum(stats_train[1])
        (self.rs_test_acc if acc is None else acc).append(test_acc)
        (self.rs_train_loss if loss is None else loss).append(train_loss)
        print("Averaged Train Loss: {:.4f}".format(train_loss))
        print("Averaged Test Accuracy: {:.4f}".format(test_acc))

    # ----- test-only: what the fixture's test inspects --------------------------------------------------
    def dump_state(self, tag):
        arrays = {}
        for c in self.clients:
            for name, p in c.model.named_parameters():
                arrays[f"client{c.id}:{name}"] = p.detach().cpu().numpy()
        for name, p in self.global_model.named_parameters():
            arrays[f"global:{name}"] = p.detach().cpu().numpy()
        owners = {id(p): c.id for c in self.clients for p in c.model.parameters()}
        arrays["uploaded_ids"] = np.array(self.uploaded_ids, dtype=np.int64)
        arrays["upload_owners"] = np.array([owners.get(id(next(m.parameters())), -1)
                                           for m in self.uploaded_models], dtype=np.int64)
        path = f"../results/{self.dataset}_{self.algorithm}_{self.goal}_{self.times}_{tag}.npz"
        np.savez(path, **arrays)

    def finish_for_test(self):
        self.dump_state("trained")
        self.send_models()
        self.dump_state("broadcast")
