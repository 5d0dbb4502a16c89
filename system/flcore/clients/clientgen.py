"""FedGen's client (Zhu, Hong, Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning",
ICML 2021).

The whole model is shared (the head only under ``-lf``). Once the server has trained its generator,
local training minimises the paper's objective (its eq. 5)::

    CE(head(base(x)), y) + CE(head(z), y_hat),   y_hat ~ p(y),  z = G(eps, y_hat),  eps ~ N(0, I)

on each real batch and as many generated features, ``p(y)`` being the label distribution the server
estimates from the label counts clients upload. The generated features reach only the head: the
federation's knowledge of what each label looks like in feature space, distilled into every head without
any data. Labels and noise come from the client's own generator, drawn after each batch's order. Before
the generator has been trained (round 0) the objective is plain cross-entropy.
"""
from __future__ import annotations

from typing import Optional

import torch

from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedGenParams
from flcore.training.feature_generator import FeatureGenerator, generated_features
from flcore.vmapped.support import Refused

DRAWS_PER_STEP = "every step draws labels and noise for the generated features from the client's generator"


class clientGen(Client):
    batched = Refused(DRAWS_PER_STEP)

    hparams: FedGenParams

    def setup(self) -> None:
        # Fixed by the client's data; uploaded every round so the server can estimate p(y) and weigh the heads.
        self.label_counts = torch.bincount(self.train_data.y, minlength=self.num_classes)
        # Given by the server with every broadcast (None until it has trained the generator).
        self.feature_generator: Optional[FeatureGenerator] = None
        self.label_distribution: Optional[torch.Tensor] = None

    def receive_generator(self, generator: Optional[FeatureGenerator], distribution: Optional[torch.Tensor]) -> None:
        """The server's frozen generator (eval mode, no gradients) and its estimate of p(y) (C,)."""
        self.feature_generator = generator
        self.label_distribution = distribution

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss(self.model(x), y)
        if self.feature_generator is None:
            return loss
        labels, features = generated_features(self.feature_generator, self.label_distribution, self.batch_size,
                                              self.generator, y.device)
        return loss + self.loss(self.model.head(features), labels)

    def upload_extras(self) -> dict:
        return {"label_counts": self.label_counts}

    def fine_tune(self, epochs: int) -> None:
        """A new client trains with FedGen's own objective, the generated features included."""
        self.model.train()
        self.run_epochs(epochs, self.local_loss)


class clientGenSharedHead(clientGen):
    """``-lf``: only the head is exchanged; the feature extractor stays the client's own."""
    batched = Refused(DRAWS_PER_STEP)
    shared_path = "head"
