"""The model a client received at the start of the round, kept frozen while it trains.

FedProx and FedDyn anchor their regularisers to it, MOON uses its features as the positive pair,
FedNTD distils from its logits, SCAFFOLD measures its update from it. It exists only during local
training (from :meth:`begin_local_training` to the end of :meth:`end_local_training`), so memory holds
one extra model per client *in training*, not one per client, and it is never state to carry
across rounds.

Under ``X+LAG`` the received model holds the broadcast shared layers and the client's own personal
layers, i.e. exactly the point this client starts from; that is the anchor each method needs.
"""
from __future__ import annotations

import copy
from typing import Optional

from torch import nn

from flcore.clients.clientbase import Client
from flcore.training.objective import Teacher

# The objectives' handle on it (``model.teacher(RECEIVED, x)``): the whole model, frozen.
RECEIVED = Teacher("received_model")


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy that takes no gradients and runs in eval mode (no dropout, BN uses its running stats)."""
    clone = copy.deepcopy(model)
    for param in clone.parameters():
        param.grad = None
    return clone.requires_grad_(False).eval()


class ReceivedModelClient(Client):
    """A client that holds ``received_model`` (what it started from) while it trains."""

    def setup(self) -> None:
        self.received_model: Optional[nn.Module] = None

    def begin_local_training(self) -> None:
        super().begin_local_training()
        self.received_model = frozen_copy(self.model)

    def end_local_training(self) -> None:
        """Subclasses use ``received_model`` first, then call this."""
        super().end_local_training()
        self.received_model = None
