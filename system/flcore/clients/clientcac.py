"""FedCAC's client (Wu, Liu, Niu, Zhu, Tang, "Bold but Cautious: Unlocking the Potential of
Personalized Federated Learning through Cautiously Aggressive Collaboration", ICCV 2023).

After local training the client marks its critical parameters: in every parameter tensor, the top
``-tau`` fraction by sensitivity ``|delta_theta * theta|`` (delta over this round's local training).
The mask is its persistent state. On a broadcast, critical entries are taken from the client's
customised global model (the mean over itself and the clients whose masks overlap enough; its own
values when no one qualifies) and every other entry, buffers included, from the global average.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from flcore.aggregation import State, copy_into
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedCACParams


def critical_mask(before: torch.Tensor, after: torch.Tensor, tau: float) -> torch.Tensor:
    """The ``int(tau * numel)`` entries of largest ``|(after - before) * after|`` (bool, shape of ``after``).

    Ties are broken by position (a stable sort); entries of zero sensitivity are never critical.
    """
    sensitivity = ((after - before) * after).abs().reshape(-1)
    count = int(tau * sensitivity.numel())
    mask = torch.zeros_like(sensitivity, dtype=torch.bool)
    if count > 0:
        top = torch.sort(sensitivity, descending=True, stable=True).indices[:count]
        mask[top] = True
        mask &= sensitivity > 0
    return mask.reshape(after.shape)


class clientCAC(Client):
    batched = PLAIN  # cross-entropy training; the critical masks come from the begin and end hooks
    persistent_attrs = ("critical_masks",)

    hparams: FedCACParams

    def setup(self) -> None:
        self.tau = self.hparams.critical_fraction
        self.critical_masks: Dict[str, torch.Tensor] = {}  # empty until the client first trains
        self._start: State = {}  # this round's starting parameters; rebuilt every round

    def begin_local_training(self) -> None:
        super().begin_local_training()
        self._start = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def end_local_training(self) -> None:
        self.critical_masks = {n: critical_mask(self._start[n], p.detach(), self.tau)
                               for n, p in self.model.named_parameters()}
        self._start = {}
        super().end_local_training()

    @torch.no_grad()
    def receive_customised(self, global_state: Mapping[str, torch.Tensor],
                           customised: Optional[Mapping[str, torch.Tensor]]) -> None:
        """Critical entries from ``customised`` (None: keep this client's own), the rest from the global
        broadcast ``global_state``; a tensor the broadcast leaves out (a layer ``X+LAG`` keeps personal)
        stays this client's own."""
        if not self.critical_masks:
            copy_into(self.model, global_state)
            return
        params = dict(self.model.named_parameters())
        for name, param in params.items():
            if name not in global_state:
                continue
            critical_source = param.detach().clone() if customised is None else customised[name]
            param.copy_(torch.where(self.critical_masks[name], critical_source, global_state[name]))
        copy_into(self.model, global_state, [n for n in global_state if n not in params])
