"""FedDyn's client (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021).

The whole model is shared. Client k minimises
``L_k(w) - <w, g_k> + alpha/2 * ||w - w_received||^2``, where ``g_k`` is its own estimate of
``grad L_k`` at the end of its previous round (zero before it first trains). After training,
``g_k <- g_k - alpha * (w - w_received)``, the first-order optimality condition of that objective.
``g_k`` is the client's persistent state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn.functional as F

from flcore.aggregation import zeros_like_parameters
from flcore.vmapped.support import PLAIN
from flcore.hyperparameters import FedDynParams
from flcore.training.objective import Fixed, LiveModel, ModelView, Objective, squared_distance
from flcore.training.received import RECEIVED, ReceivedModelClient

GRADIENT_ESTIMATE = Fixed("previous_gradient")  # g_k, by parameter name


@dataclass(frozen=True)
class DynamicRegularised(Objective):
    """``CE(model(x), y) + (alpha/2 * ||w - w_received||^2 - <w, g_k>)``."""
    alpha: float

    def inputs(self):
        return (RECEIVED, GRADIENT_ESTIMATE)

    def __call__(self, model, x, y):
        return F.cross_entropy(model(x), y) + self.regulariser(model)

    def regulariser(self, model: ModelView) -> torch.Tensor:
        """``-<w, g_k> + alpha/2 * ||w - w_received||^2``, summed over every parameter tensor."""
        gradient = model.fixed(GRADIENT_ESTIMATE)
        linear = torch.stack([(param * gradient[name]).sum() for name, param in model.named_parameters()]).sum()
        received = model.teacher_parameters(RECEIVED)
        return 0.5 * self.alpha * squared_distance(model.named_parameters(), received) - linear


class clientDyn(ReceivedModelClient):
    batched = PLAIN
    persistent_attrs = ("previous_gradient",)

    hparams: FedDynParams

    def setup(self) -> None:
        super().setup()
        self.alpha = self.hparams.regulariser_weight
        self.objective = DynamicRegularised(self.alpha)
        self.previous_gradient: Dict[str, torch.Tensor] = zeros_like_parameters(self.model)

    def dynamic_regulariser(self) -> torch.Tensor:
        """The objective's regulariser at this client's current model (after ``begin_local_training``)."""
        return self.objective.regulariser(LiveModel(self))

    @torch.no_grad()
    def end_local_training(self) -> None:
        received = dict(self.received_model.named_parameters())
        for name, param in self.model.named_parameters():
            self.previous_gradient[name].sub_(param - received[name], alpha=self.alpha)
        super().end_local_training()
