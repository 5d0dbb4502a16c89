"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and Classifier
Collaboration", ICLR 2023).

Shared: the body (feature extractor), sample-weighted average. Local: the head, which after each
round becomes a per-client combination of the uploaded heads, sum_j alpha_ij head_j, with alpha_i
minimising ``alpha^T (diag(V) + D_i) alpha`` on the simplex: V_j is the variance of client j's
feature statistics and D_i[j, l] = <h_i - h_j, h_i - h_l> compares clients' class-weighted feature
means (the bias of borrowing j's head). Clients also align their features (``-lam`` x MSE) to global
class prototypes, the sample-weighted mean of the clients' prototypes, which the server broadcasts.
Evaluation: the received body under the client's combined head (PFLLIB.md section 6).

Not reproduced from PFLlib: statistics of the selected clients combined with heads of the uploaded
ones (they differ under ``-cdr``), a failed QP row falling back to ``uploaded_heads[client_id]``
(a position used as an id), and heads combined from live modules while earlier clients' heads are
being overwritten; prototypes are pooled by sample count (the authors' code), not by a plain mean.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from scipy.optimize import minimize

from flcore.aggregation import copy_into, weighted_average
from flcore.clients.clientpac import clientPAC
from flcore.hyperparameters import FedPACParams
from flcore.servers.serverbase import Server
from flcore.training.classfeatures import pooled_prototypes

SMALL_WEIGHT = 1e-3  # weights below this are dropped and the rest renormalised (reference code: 1e-3)


class FedPAC(Server):
    """New clients (-nnc): the global body and a fresh head (the initial head every training client
    started from: a newcomer has no feature statistics of its own yet for the classifier-combination
    QP), then -ften epochs of cross-entropy on body and head together (FedPAC's fine-tuning)."""
    client_class = clientPAC
    persistent_attrs = ("global_prototypes", "global_prototype_mask")

    hparams: FedPACParams

    def setup(self) -> None:
        self.global_prototypes: Optional[torch.Tensor] = None
        self.global_prototype_mask: Optional[torch.Tensor] = None
        self.head_weights: Optional[np.ndarray] = None  # last round's alpha, rows/columns = uploaded_ids

    def send_models(self) -> None:
        super().send_models()
        if self.global_prototypes is not None:
            for client in self.clients:
                client.set_global_prototypes(self.global_prototypes, self.global_prototype_mask)

    def aggregate_parameters(self) -> None:
        super().aggregate_parameters()  # the bodies
        # Recorded per round: the weight each uploader gives its own head (how personal it stays).
        # The full n x n matrix is kept for the last round only (head_weights): it grows as clients^2.
        own_weight = np.full(self.num_clients, np.nan)
        if self.uploads:
            uploaded = [update.extras for update in self.uploads]
            self.global_prototypes, self.global_prototype_mask = pooled_prototypes(
                [e["prototypes"] for e in uploaded], [e["prototype_counts"] for e in uploaded])
            references = torch.stack([e["class_reference"] for e in uploaded])
            self.head_weights = head_combination_weights([e["feature_variance"] for e in uploaded], references)
            self.combine_heads(self.head_weights)
            own_weight[self.uploader_ids()] = np.diag(self.head_weights)
        self.record("rs_head_own_weight", own_weight)

    def combine_heads(self, weights: np.ndarray) -> None:
        """Uploader ``i`` gets ``sum_j weights[i, j] * head_j`` of the heads as uploaded."""
        # Snapshot first: uploaded heads may be views of the clients' heads, overwritten one client at a time.
        heads = [{n: t.clone() for n, t in update.extras["head"].items()} for update in self.uploads]
        for i, client_id in enumerate(self.uploader_ids()):
            client = self._client(client_id)
            client.check_out()
            copy_into(client.model.head, weighted_average(heads, weights[i].tolist()))

    def _client(self, client_id: int) -> clientPAC:
        return next(c for c in self.clients if c.id == client_id)


def head_combination_weights(variances, references: torch.Tensor) -> np.ndarray:
    """Row i: client i's combination weights over the n uploaded heads (FedPAC's QP).

    ``variances``: n values V_j; ``references``: (n, C, D) class-weighted feature means h_j.
    """
    h = references.detach().flatten(1).double().cpu().numpy()            # (n, C*D)
    v = np.clip(np.asarray(variances, dtype=np.float64), 0.0, None)
    n = len(v)
    weights = np.zeros((n, n))
    for i in range(n):
        gap = h[i] - h                                                     # h_i - h_j, row j
        alpha = simplex_qp(np.diag(v) + gap @ gap.T)
        weights[i] = alpha if alpha is not None else np.eye(n)[i]          # no solution: own head only
    return weights


def simplex_qp(p_matrix: np.ndarray) -> Optional[np.ndarray]:
    """argmin alpha^T P alpha subject to alpha >= 0, sum(alpha) = 1 (SciPy SLSQP); None if it fails.

    P is positive semi-definite (a Gram matrix plus a non-negative diagonal). It is rescaled to unit
    largest entry first: the minimiser does not change, and SLSQP's tolerances become meaningful.
    """
    n = p_matrix.shape[0]
    p_matrix = (p_matrix + p_matrix.T) / 2
    scale = np.abs(p_matrix).max()
    if not np.isfinite(scale):
        return None
    if scale == 0:
        return np.full(n, 1.0 / n)  # every combination is optimal; share equally
    q = p_matrix / scale
    result = minimize(lambda a: a @ q @ a, np.full(n, 1.0 / n), jac=lambda a: 2 * q @ a, method="SLSQP",
                      bounds=[(0.0, 1.0)] * n,
                      constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones(n)}],
                      options={"ftol": 1e-12, "maxiter": 500})
    if not result.success:
        return None
    alpha = np.clip(result.x, 0.0, None)
    alpha[alpha < SMALL_WEIGHT] = 0.0
    total = alpha.sum()
    return alpha / total if total > 0 else None
