"""FedCAC (Wu, Liu, Niu, Zhu, Tang, "Bold but Cautious: Unlocking the Potential of Personalized
Federated Learning through Cautiously Aggressive Collaboration", ICCV 2023).

The whole model is uploaded with each client's critical-parameter mask (top ``-tau`` fraction of
``|delta_theta * theta|`` per tensor). Non-critical parameters collaborate boldly: they come from the
sample-weighted global average. Critical parameters collaborate cautiously: client i takes them from
its customised global model, the plain mean of its own model and those of the clients whose mask
overlap ``1 - |m_i - m_j|_1 / (2 |m_i|_1)`` reaches ``mean + (r / beta) (max - mean)`` (over the
pairs of last round's uploaders; r = rounds aggregated so far, ``-bt`` beta > 0). The threshold rises
each round, so collaboration on critical parameters narrows until they are fully personal.
Uploaders of the last round get their customised model; other clients keep their own critical values.
Each client reports its model as received. Per round, ``rs_cac_threshold`` and
``rs_cac_collaborators`` (mean number of other clients in a customised model) are recorded.

This follows the paper and the authors' code (critical entries from the customised model, which is
the client's own when no one overlaps enough), rather than keeping critical entries always local.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from flcore.aggregation import State, weighted_average
from flcore.clients.clientcac import clientCAC
from flcore.hyperparameters import FedCACParams
from flcore.servers.serverbase import Server


def mask_overlaps(masks: Sequence[Dict[str, torch.Tensor]]) -> torch.Tensor:
    """``O[i, j] = 1 - |m_i - m_j|_1 / (2 |m_i|_1)`` for every pair of clients (float64, n x n).

    Counts come from per-tensor Gram matrices of the 0/1 masks (|m_i - m_j|_1 = |m_i| + |m_j| - 2 m_i.m_j),
    so no client's flattened mask is ever concatenated. A client with an empty mask overlaps 0.
    """
    n = len(masks)
    device = next(iter(masks[0].values())).device
    shared = torch.zeros(n, n, dtype=torch.float64, device=device)
    for name in masks[0]:
        rows = torch.stack([m[name].reshape(-1) for m in masks]).float()
        shared += (rows @ rows.T).double()
    sizes = shared.diagonal().clone()
    differing = sizes.unsqueeze(1) + sizes.unsqueeze(0) - 2 * shared
    overlap = 1 - differing / (2 * sizes.clamp(min=1).unsqueeze(1))
    return torch.where(sizes.unsqueeze(1) > 0, overlap, torch.zeros_like(overlap))


def collaboration_threshold(overlaps: torch.Tensor, rounds_done: int, beta: float) -> float:
    """``mean + (rounds_done / beta) * (max - mean)`` over the off-diagonal overlaps."""
    n = overlaps.shape[0]
    off_diagonal = overlaps[~torch.eye(n, dtype=torch.bool, device=overlaps.device)]
    mean, top = float(off_diagonal.mean()), float(off_diagonal.max())
    return mean + rounds_done / beta * (top - mean)


class FedCAC(Server):
    """New clients (-nnc): the global model whole (a newcomer has no critical-parameter mask, so every
    entry comes from the global average, as for a client before its first upload), then -ften epochs of
    plain cross-entropy fine-tuning."""
    client_class = clientCAC
    persistent_attrs = ("previous_uploaders",)

    hparams: FedCACParams

    def setup(self) -> None:
        self.beta = self.hparams.threshold_rounds
        self.previous_uploaders: List[int] = []  # ids whose models and masks form the customised models

    def customised_models(self) -> Tuple[Dict[int, State], float, float]:
        """Customised global model (parameters) of each of last round's uploaders, the threshold used
        and the mean number of collaborators."""
        by_id = {c.id: c for c in self.clients}
        uploaders = [c for c in self.in_use([by_id[i] for i in self.previous_uploaders]) if c.critical_masks]
        if len(uploaders) < 2:
            return {}, float("nan"), 0.0
        overlaps = mask_overlaps([c.critical_masks for c in uploaders])
        threshold = collaboration_threshold(overlaps, self.current_round, self.beta)
        states = [dict(c.model.named_parameters()) for c in uploaders]
        customised, others = {}, []
        for a, client in enumerate(uploaders):
            group = [a] + [b for b in range(len(uploaders)) if b != a and float(overlaps[a, b]) >= threshold]
            customised[client.id] = weighted_average([states[b] for b in group], [1.0 / len(group)] * len(group))
            others.append(len(group) - 1)
        return customised, threshold, sum(others) / len(others)

    def send_models(self) -> None:
        # Every customised model is formed before any client model is overwritten.
        customised, threshold, collaborators = self.customised_models()
        global_state = self.broadcast()
        for client in self.in_use(self.clients):
            client.receive_customised(global_state, customised.get(client.id))
        self.record("rs_cac_threshold", threshold)
        self.record("rs_cac_collaborators", collaborators)

    def aggregate_parameters(self) -> None:
        super().aggregate_parameters()
        self.previous_uploaders = self.uploader_ids()
