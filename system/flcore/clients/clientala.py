"""FedALA's client (Zhang, Hua, Wang, Shen, Guan, Zhu, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023).

The whole model is uploaded and averaged. What the client does with the received global model is
Adaptive Local Aggregation (ALA): the lower parameter tensors are replaced by the global ones; the
last ``-p`` tensors become ``theta_l + (theta_g - theta_l) * W`` element-wise, with ``W`` in [0, 1]
learned by SGD (lr ``-et``) on a random ``-s`` percent of the local training data, gradient
``dL/dW = dL/dtheta (*) (theta_g - theta_l)``, clipped to [0, 1] after every step. ``W`` starts at
ones and is kept from round to round. In the start phase (the first round in which the global model
differs from the local one) ``W`` is trained until the epoch loss settles; afterwards one epoch per
round. Buffers (BatchNorm statistics) are taken from the global model.
"""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np
import torch
from torch.func import functional_call

from flcore.aggregation import copy_into
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedALAParams
from utils.client_data import ClientData
# losses below 0.1. The cap is ours: the rule alone may never fire on noisy data.
CONVERGENCE_WINDOW = 10
CONVERGENCE_STD = 0.1
MAX_START_PHASE_EPOCHS = 50


def mix(local: torch.Tensor, global_: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """ALA's element-wise aggregation ``local + (global - local) * weight``."""
    return local + (global_ - local) * weight


class clientALA(Client):
    batched = PLAIN  # cross-entropy training; ALA's weight search runs at the broadcast, before it
    persistent_attrs = ("ala_weights", "ala_start_phase")

    hparams: FedALAParams

    def setup(self) -> None:
        self.eta = self.hparams.weight_learning_rate
        self.rand_percent = self.hparams.sample_percent
        names = [name for name, _ in self.model.named_parameters()]
        self.mixed_names = names[-self.hparams.mixed_tensors:]
        params = dict(self.model.named_parameters())
        self.ala_weights: Dict[str, torch.Tensor] = {n: torch.ones_like(params[n]) for n in self.mixed_names}
        self.ala_start_phase = True

    def adaptive_local_aggregation(self, received: Mapping[str, torch.Tensor]) -> None:
        """Receive the broadcast ``received``: lower tensors copied, the last ``-p`` mixed with learned ``W``.

        A tensor the broadcast leaves out (a layer ``X+LAG`` keeps personal, with its module's buffers)
        stays as it is, so ``W`` is learned on the model the client will really hold.
        """
        global_state = received
        params = dict(self.model.named_parameters())
        mixed = [n for n in self.mixed_names if n in global_state]
        # Where the upper layers already equal the global ones (before the first aggregation) the
        # mix is the identity whatever W is, and W's gradient is zero: nothing to learn.
        differs = any(not torch.equal(params[n], global_state[n]) for n in mixed)
        copy_into(self.model, global_state, [n for n in global_state if n not in self.mixed_names])
        if not differs:
            return
        local = {n: params[n].detach().clone() for n in mixed}
        received = {n: global_state[n].detach() for n in mixed}
        self._learn_weights(local, received)
        with torch.no_grad():
            for n in mixed:
                params[n].copy_(mix(local[n], received[n], self.ala_weights[n]))

    def _learn_weights(self, local: Dict[str, torch.Tensor], received: Dict[str, torch.Tensor]) -> None:
        sample = self._ala_sample()
        # Every other tensor enters as a constant: no gradient flows into the model itself.
        constants = {n: p.detach() for n, p in self.model.named_parameters() if n not in local}
        names = list(local)
        was_training = self.model.training
        self.model.eval()  # no dropout, and BatchNorm statistics are not disturbed by W's search
        epoch_losses = []
        for _ in range(MAX_START_PHASE_EPOCHS if self.ala_start_phase else 1):
            total = torch.zeros((), dtype=torch.float64, device=sample.y.device)
            batches = 0
            for x, y in sample.train_batches(self.batch_size, self.generator):
                weights = [self.ala_weights[n].detach().requires_grad_(True) for n in names]
                mixed = {n: mix(local[n], received[n], w) for n, w in zip(names, weights)}
                loss = self.loss(functional_call(self.model, {**constants, **mixed}, (x,)), y)
                grads = torch.autograd.grad(loss, weights)
                with torch.no_grad():
                    for n, g in zip(names, grads):
                        self.ala_weights[n] = (self.ala_weights[n] - self.eta * g).clamp_(0.0, 1.0)
                total += loss.detach()
                batches += 1
            epoch_losses.append(float(total) / max(batches, 1))
            if len(epoch_losses) >= CONVERGENCE_WINDOW and np.std(epoch_losses[-CONVERGENCE_WINDOW:]) < CONVERGENCE_STD:
                break
        self.ala_start_phase = False
        self.model.train(was_training)

    def _ala_sample(self) -> ClientData:
        """A random ``-s`` percent of the local training data (at least one sample), drawn anew each round."""
        n = len(self.train_data)
        count = max(1, int(n * self.rand_percent / 100))
        index = torch.randperm(n, generator=self.generator)[:count].to(self.train_data.y.device)
        return self.train_data.rows(index)
