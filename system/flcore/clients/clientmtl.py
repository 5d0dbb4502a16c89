"""FedMTL's client (Smith, Chiang, Sanjabi, Talwalkar, "Federated Multi-Task Learning", NeurIPS 2017).

Each client is one task t and keeps its own model w_t, which nothing overwrites. The federation minimises
``sum_t L_t(w_t) + lamda/2 tr(W Omega W^T)`` (W = [w_1 .. w_m], Omega the tasks' relationships). With the other
tasks' models as the server last saw them, the gradient of the regulariser in w_t is
``lamda * Omega_tt * (w_t - a_t)``, ``a_t = -(1/Omega_tt) sum_{s != t} Omega_ts w_s``; so local training
minimises ``CE + lamda/2 * Omega_tt * ||w_t - a_t||^2``, which has that gradient (it differs from the
regulariser by a constant in w_t). The server sends ``a_t`` (``relationship_anchor``, by parameter name) and
``Omega_tt`` (``relationship_self_weight``) before the client trains.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedMTLParams
from flcore.training.objective import Fixed, Objective
from flcore.vmapped.support import PLAIN

ANCHOR = Fixed("relationship_anchor")            # a_t, by parameter name
SELF_WEIGHT = Fixed("relationship_self_weight")  # Omega_tt, a 0-dim tensor


@dataclass(frozen=True)
class TaskRelationship(Objective):
    """``CE(model(x), y) + lamda/2 * Omega_tt * sum_l ||w_l - a_l||^2`` over the parameters the anchor names
    (the layers X+LAG keeps personal are not coupled); cross-entropy alone when ``lamda`` is 0."""
    lamda: float

    def inputs(self):
        return (ANCHOR, SELF_WEIGHT) if self.lamda else ()

    def __call__(self, model, x, y):
        loss = F.cross_entropy(model(x), y)
        if self.lamda == 0:
            return loss
        anchor = model.fixed(ANCHOR)
        if not anchor:  # nothing received yet (a client trained outside a round)
            return loss
        params = dict(model.named_parameters())
        distance = torch.stack([(params[name] - a).pow(2).sum() for name, a in anchor.items()]).sum()
        return loss + 0.5 * self.lamda * model.fixed(SELF_WEIGHT) * distance


class clientMTL(Client):
    batched = PLAIN  # cross-entropy plus a pull towards a tensor fixed for the round

    hparams: FedMTLParams

    def setup(self) -> None:
        self.lamda = self.hparams.relationship_weight
        self.objective = TaskRelationship(self.lamda)
        # Rebuilt by the server before every local training (never state to carry between rounds).
        self.relationship_anchor: Dict[str, torch.Tensor] = {}
        self.relationship_self_weight = torch.zeros(())

    def receive_relationships(self, self_weight: float, anchor: Dict[str, torch.Tensor]) -> None:
        """This round's ``Omega_tt`` and ``a_t`` (tensors by parameter name; the client does not change them)."""
        self.relationship_self_weight = torch.tensor(float(self_weight), device=self.train_data.y.device)
        self.relationship_anchor = anchor

    def fine_tune(self, epochs: int) -> None:
        """A new task fine-tunes with FedMTL's own objective, coupled to the tasks the server knows."""
        self.model.train()
        self.run_epochs(epochs, self.local_loss)
