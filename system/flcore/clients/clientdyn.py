"""FedDyn's client (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021).

The whole model is shared. Client k minimises
``L_k(w) - <w, g_k> + alpha/2 * ||w - w_received||^2``, where ``g_k`` is its own estimate of
``grad L_k`` at the end of its previous round (zero before it first trains). After training,
``g_k <- g_k - alpha * (w - w_received)``, the first-order optimality condition of that objective.
``g_k`` is the client's persistent state.
"""
from __future__ import annotations

from typing import Dict

import torch

from flcore.aggregation import zeros_like_parameters
from flcore.hyperparameters import FedDynParams
from flcore.training.received import ReceivedModelClient, squared_distance


class clientDyn(ReceivedModelClient):
    persistent_attrs = ("previous_gradient",)

    hparams: FedDynParams

    def setup(self) -> None:
        super().setup()
        self.alpha = self.hparams.regulariser_weight
        self.previous_gradient: Dict[str, torch.Tensor] = zeros_like_parameters(self.model)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), y) + self.dynamic_regulariser()

    def dynamic_regulariser(self) -> torch.Tensor:
        """``-<w, g_k> + alpha/2 * ||w - w_received||^2``, summed over every parameter tensor."""
        linear = torch.stack([(param * self.previous_gradient[name]).sum()
                              for name, param in self.model.named_parameters()]).sum()
        return 0.5 * self.alpha * squared_distance(self.model, self.received_model) - linear

    @torch.no_grad()
    def end_local_training(self) -> None:
        received = dict(self.received_model.named_parameters())
        for name, param in self.model.named_parameters():
            self.previous_gradient[name].sub_(param - received[name], alpha=self.alpha)
        super().end_local_training()
