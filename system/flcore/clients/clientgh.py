"""FedGH's client (Yi et al., "FedGH: Heterogeneous Federated Learning with Generalized Global
Header", ACM MM 2023).

The client trains its whole model (personal body + the global head it received) with cross-entropy,
then uploads one prototype per local class: the mean feature of its training samples under the
trained body. Only the head is received (``shared_path = "head"``); the body never leaves.
"""
from __future__ import annotations

from typing import Optional

import torch

from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.training.classfeatures import class_feature_stats


class clientGH(Client):
    batched = PLAIN  # cross-entropy training; the prototypes are measured in the end hook
    shared_path = "head"
    # Computed at the end of training and read by the server in the same round; listed so that an
    # executor running train() elsewhere brings them back.
    persistent_attrs = ("prototypes", "prototype_counts")

    def setup(self) -> None:
        self.prototypes: Optional[torch.Tensor] = None        # (C, D) mean feature per class
        self.prototype_counts: Optional[torch.Tensor] = None  # (C,) samples per class; 0 = not uploaded

    def end_local_training(self) -> None:
        stats = class_feature_stats(self.model.base, self.train_data, self.num_classes)
        self.prototypes = stats.means()
        self.prototype_counts = stats.counts

    def upload_extras(self) -> dict:
        return {"prototypes": self.prototypes, "prototype_counts": self.prototype_counts}
