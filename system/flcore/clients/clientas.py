"""FedAS's client (Yang, Huang, Ye, "FedAS: Bridging Inconsistency in Personalized Federated
Learning", CVPR 2024).

Parameter alignment: a selected client does not take the global body as it is. It first measures
its class prototypes with its own current body, then trains a private copy of the global body for
one epoch (SGD, lr 0.01) to map its data onto those prototypes, and adopts that aligned body; the
head stays its own. Then it trains the whole model with cross-entropy and measures the trace of the
Fisher information of its model on its data, which weights its body in the server's average.
"""
from __future__ import annotations

import copy
from typing import Iterable, Mapping, Tuple

import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.training.classfeatures import class_feature_stats

ALIGNMENT_LR = 0.01     # the reference code's constants; PFLlib has no flags for them
ALIGNMENT_EPOCHS = 1


class clientAS(Client):
    batched = PLAIN  # cross-entropy training; the alignment runs at the broadcast, the Fisher trace in the end hook
    shared_path = "base"
    # Measured after training and read by the server in the same round.
    persistent_attrs = ("fisher_trace",)

    def setup(self) -> None:
        self.fisher_trace: float = float("nan")

    def receive_aligned(self, received: Mapping[str, torch.Tensor]) -> None:
        """Adopt the broadcast body ``received`` after aligning a private copy of it to this client's
        prototypes.

        A tensor the broadcast leaves out (a layer ``X+LAG`` keeps personal, with its module's buffers)
        stays this client's own: the copy holds the client's value there, so alignment trains the body
        the client will really hold, and that position is not adopted.
        """
        stats = class_feature_stats(self.model.base, self.train_data, self.num_classes)
        prototypes = stats.means()
        # A copy, not the server's tensors in place (PFLlib #244 trained the global model itself).
        aligned = copy.deepcopy(self.shared_module())
        copy_into(aligned, received)
        aligned.train()
        optimizer = torch.optim.SGD(aligned.parameters(), lr=ALIGNMENT_LR)
        for _ in range(ALIGNMENT_EPOCHS):
            for x, y in self.train_data.train_batches(self.batch_size, self.generator):
                loss = prototype_alignment_loss(aligned(x), y, prototypes)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        adopted = named_tensors(aligned)
        copy_into(self.shared_module(), adopted, [n for n in adopted if n in received])

    def end_local_training(self) -> None:
        batches = self.train_data.train_batches(self.batch_size, self.generator)
        self.fisher_trace = float(fisher_trace(self.model, batches))

    def upload_extras(self) -> dict:
        return {"fisher_trace": self.fisher_trace}


def prototype_alignment_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Sum over the classes in the batch of the MSE between their features and their prototype.

    Every class in the batch counts equally, however many of its samples the batch holds.
    """
    squared_error = (features - prototypes[labels].to(features.dtype)).pow(2).mean(dim=1)  # (B,)
    per_class = torch.bincount(labels, minlength=prototypes.shape[0])[labels]
    return (squared_error / per_class).sum()


def fisher_trace(model: nn.Module, batches: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Trace of the empirical Fisher information, estimated per minibatch as in the reference code:
    the sum over batches of ||grad of the batch's mean negative log-likelihood||^2, in eval mode."""
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros((), dtype=torch.float64, device=params[0].device)
    try:
        for x, y in batches:
            nll = nn.functional.cross_entropy(model(x), y)
            grads = torch.autograd.grad(nll, params, allow_unused=True)
            total += sum(g.double().pow(2).sum() for g in grads if g is not None)
    finally:
        model.train(was_training)
    return total
