"""FedFomo's client (Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with
First Order Model Optimization", ICLR 2021).

The last 20% of the client's training data is held out as its validation set; it trains on the
rest. Given the models ``theta_n`` the server downloads to it, it weighs each by the first-order
gain ``w_n = (L(theta_old) - L(theta_n)) / ||theta_n - theta_old||`` (validation losses, parameter
distance), keeps ``max(w_n, 0)`` normalised to sum 1, and replaces its model by
``theta_old + sum_n w_n (theta_n - theta_old) = sum_n w_n theta_n``; when no download
lowers its validation loss it keeps its own model. The raw ``w_n`` go back to the server, which
adds them to its affinities. A download identical to ``theta_old`` carries no information: weight 0.
"""
from __future__ import annotations

import copy
from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from flcore.aggregation import State, copy_into, weighted_average
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import EVAL_BATCH_SIZE, Client
from flcore.hyperparameters import FedFomoParams
from utils.client_data import ClientData

VALIDATION_FRACTION = 0.2


def split_validation(data: ClientData, fraction: float = VALIDATION_FRACTION) -> Tuple[ClientData, ClientData]:
    """(first part, last ``fraction``) of ``data``; at least one sample on each side when there are two."""
    n = len(data)
    held_out = min(max(int(fraction * n), 1), n - 1) if n >= 2 else 0
    cut = n - held_out
    return data.rows(slice(None, cut)), data.rows(slice(cut, None))


def fomo_weights(old_loss: float, losses: torch.Tensor, distances: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(raw, normalised)`` FedFomo weights of the downloads.

    raw ``w_n = (old_loss - losses[n]) / distances[n]`` (0 where the distance is 0); normalised =
    ``max(w, 0) / sum(max(w, 0))``, all zeros when no download improves on the old model.
    """
    raw = torch.where(distances > 0, (old_loss - losses) / torch.where(distances > 0, distances, 1.0),
                      torch.zeros_like(losses))
    positive = raw.clamp(min=0)
    total = positive.sum()
    return raw, (positive / total if total > 0 else positive)


class clientFomo(Client):
    batched = PLAIN  # cross-entropy training; the downloads are weighed at the broadcast, before it

    def __init__(self, config, hparams: FedFomoParams, id: int, train_data: ClientData,
                 test_data: ClientData, model: nn.Module):
        train_part, validation = split_validation(train_data)
        super().__init__(config, hparams, id, train_part, test_data, model)
        self.validation_data = validation
        # Scratch space to score a download; holds nothing between rounds.
        self._download = copy.deepcopy(self.model).requires_grad_(False)
        # Raw weights of this round's downloads, by client id, read by the server with the upload.
        self.download_weights: Dict[int, float] = {}
        self.kept_own_model = True

    def take_data(self, train_data: ClientData, test_data: ClientData,
                  val_data: Optional[ClientData] = None) -> None:
        train_part, self.validation_data = split_validation(train_data)
        super().take_data(train_part, test_data, val_data)

    def upload_extras(self) -> dict:
        """The raw weight this client gave each model it downloaded (the server's affinities grow by them)."""
        return {"download_weights": dict(self.download_weights)}

    @torch.no_grad()
    def validation_loss(self, model: nn.Module) -> float:
        if len(self.validation_data) == 0:
            return float("nan")
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.validation_data.y.device)
        for x, y in self.validation_data.eval_batches(EVAL_BATCH_SIZE):
            total += nn.functional.cross_entropy(model(x), y, reduction="sum").double()
        return float(total) / len(self.validation_data)

    @torch.no_grad()
    def parameter_distance(self, state: State) -> float:
        squares = [(p - state[n]).double().pow(2).sum() for n, p in self.model.named_parameters()]
        return float(torch.stack(squares).sum().sqrt())

    @torch.no_grad()
    def combine_downloads(self, ids: Sequence[int], states: Sequence[State], keep: AbstractSet[str] = frozenset()
                          ) -> List[float]:
        """Weigh the downloaded models and replace this model by their combination, except the tensors
        named in ``keep`` (the layers ``X+LAG`` keeps personal); returns the raw weights."""
        self.download_weights, self.kept_own_model = {}, True
        if not states or len(self.validation_data) == 0:
            return []
        old_loss = self.validation_loss(self.model)
        losses, distances = [], []
        for state in states:
            copy_into(self._download, state)
            losses.append(self.validation_loss(self._download))
            distances.append(self.parameter_distance(state))
        raw, normalised = fomo_weights(old_loss, torch.tensor(losses, dtype=torch.float64),
                                       torch.tensor(distances, dtype=torch.float64))
        self.download_weights = {int(i): float(w) for i, w in zip(ids, raw)}
        if normalised.sum() > 0:
            chosen = [k for k, w in enumerate(normalised.tolist()) if w > 0]
            combined = weighted_average([states[k] for k in chosen], [float(normalised[k]) for k in chosen])
            copy_into(self.model, combined, [n for n in combined if n not in keep])
            self.kept_own_model = False
        self.model.train()
        return raw.tolist()
