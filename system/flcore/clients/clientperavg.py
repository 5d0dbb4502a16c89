"""Per-FedAvg's client (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020), first-order version (FO).

The whole model w is shared. Local training minimises the MAML objective ``f(w - alpha * grad f(w))``:
each step draws two disjoint batches D, D' and sets::

    w_tilde = w - alpha * grad f(w; D)          alpha = -lr
    w       = w - beta * grad f(w_tilde; D')    beta  = -bt

(the Hessian term of the exact meta-gradient is dropped, as in the paper's FO variant). A client's
personalised model is the shared model after one SGD step on its own data: evaluation takes that step
on one training batch, measures, and restores the model (:meth:`one_step_adapted`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import PerAvgParams
from flcore.training.personal import parameter_copies, run_batch_steps
from utils.client_data import ClientData

ADAPTATION_STREAM = 0x5EA  # keeps the evaluation batches apart from the training batches


class clientPerAvg(Client):
    batched = Refused("every step draws two batches and takes two gradient steps (first-order MAML)")
    persistent_attrs = ("meta_optimizer", "adaptation_generator")

    # Not setup(): the adaptation stream is seeded from the run's seed, which a client does not keep.
    def __init__(self, config, hparams: PerAvgParams, id: int, train_data: ClientData,
                 test_data: ClientData, model: nn.Module):
        super().__init__(config, hparams, id, train_data, test_data, model)
        self.beta = hparams.meta_step_size
        # self.optimizer (lr alpha, decayed by -ld) takes the inner step; this one the meta-step.
        self.meta_optimizer = torch.optim.SGD(self.model.parameters(), lr=self.beta)
        # Evaluation draws its adaptation batch from its own stream, so evaluating (or -eg) never
        # changes the batches training sees.
        seed = np.random.SeedSequence([config.seed % 2**32, self.id, ADAPTATION_STREAM]).generate_state(1, np.uint64)
        self.adaptation_generator = torch.Generator().manual_seed(int(seed[0] >> 1))

    def local_training(self) -> None:
        self.model.train()
        run_batch_steps(self, self.local_epochs, 2 * self.batch_size, self.meta_step_on_batch)
        if self.learning_rate_decay:
            self.learning_rate_scheduler.step()

    def meta_step_on_batch(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Split one batch of 2B samples into D and D'; a client with one sample uses it for both."""
        if len(y) < 2:
            return self.meta_step(x, y, x, y)
        half = len(y) // 2
        return self.meta_step(x[:half], y[:half], x[half:], y[half:])

    def meta_step(self, x_inner: torch.Tensor, y_inner: torch.Tensor,
                  x_outer: torch.Tensor, y_outer: torch.Tensor) -> torch.Tensor:
        start = parameter_copies(self.model)
        inner = self.loss(self.model(x_inner), y_inner)
        self.optimizer.zero_grad(set_to_none=True)
        inner.backward()
        self.optimizer.step()                      # the model now holds w_tilde
        outer = self.loss(self.model(x_outer), y_outer)
        self.meta_optimizer.zero_grad(set_to_none=True)
        outer.backward()                           # grad f(w_tilde; D') ...
        copy_into(self.model, start)               # ... applied at w, not at w_tilde
        self.meta_optimizer.step()
        return inner.detach() + outer.detach()

    @contextmanager
    def one_step_adapted(self) -> Iterator[None]:
        """Inside the block the model is w - alpha * grad f(w; one training batch); restored after."""
        saved = {name: t.detach().clone() for name, t in named_tensors(self.model).items()}
        try:
            self.adapt_one_step()
            yield
        finally:
            self.check_out()  # evaluated in between, and parked
            copy_into(self.model, saved)

    def adapt_one_step(self) -> None:
        x, y = next(iter(self.train_data.train_batches(self.batch_size, self.adaptation_generator)))
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(self.loss(self.model(x), y), params)
        lr = self.optimizer.param_groups[0]["lr"]
        with torch.no_grad():
            for param, grad in zip(params, grads):
                param.sub_(grad, alpha=lr)
