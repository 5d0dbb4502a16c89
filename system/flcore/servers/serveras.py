"""FedAS (Yang, Huang, Ye, "FedAS: Bridging Inconsistency in Personalized Federated Learning",
CVPR 2024).

Shared: the body (feature extractor). Local: the head. Parameter alignment: each selected client
aligns a copy of the global body to its own class prototypes before adopting it (clients that sit
out keep their models as they are). Client synchronisation: the bodies are averaged with weights
proportional to each uploader's Fisher-information trace on its local data, so under-trained
clients (stragglers) pull the global body less. Evaluation: the client's aligned body and own head.

Not reproduced from PFLlib: the crash after the last round (an undefined
``avg_generalization_metrics``; results are saved here), alignment that trained the server's own
global model in place (#244), and NaN traces that became NaN weights and an roc_auc error (#242):
if any trace is not finite, or all are zero, the round uses sample weights instead, says so in a
warning and records it in ``rs_fisher_fallback``.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np

from flcore.clients.clientas import clientAS
from flcore.servers.serverbase import Server


class FedAS(Server):
    """New clients (-nnc): the global body as it is, without parameter alignment (alignment needs class
    prototypes from a body of the client's own, which a newcomer lacks), and a fresh head (the initial
    head every training client started from), then -ften epochs of cross-entropy fine-tuning of the
    whole model."""
    client_class = clientAS

    def send_models(self) -> None:
        """Only the selected clients receive (and align) the global body, as in PFLlib's FedAS."""
        received = self.broadcast()
        for client in self.in_use(self.selected_clients):
            client.receive_aligned(received)

    def receive_models(self) -> None:
        super().receive_models()
        traces = [update.extras["fisher_trace"] for update in self.uploads]
        weights = fisher_weights(traces)
        if weights is None and traces:
            warnings.warn(f"FedAS round {self.current_round}: Fisher traces {traces} cannot weight the "
                          f"average (not finite, or all zero); using sample weights this round")
        elif weights is not None:
            self.upload_weights = weights
        row = np.full(self.num_clients, np.nan)
        row[self.uploader_ids()] = traces
        self.record("rs_fisher_trace", row)
        self.record("rs_fisher_fallback", bool(traces) and weights is None)


def fisher_weights(traces: Sequence[float]) -> Optional[list]:
    """``trace_i / sum(traces)``; None when that is undefined (a non-finite or negative trace, or a zero sum)."""
    values = np.asarray(traces, dtype=np.float64)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0) or values.sum() <= 0:
        return None
    return (values / values.sum()).tolist()
