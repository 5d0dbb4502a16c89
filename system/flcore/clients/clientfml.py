"""FML's client (Shen, Zhang, Jia, Zhang, Huang, Zhou, Kuang, Wu, Wu, "Federated Mutual Learning",
arXiv 2006.16765, 2020).

``model`` is the meme model: received from the server each round, trained and uploaded. ``private_model``
is the local model, which never leaves the client and is what it reports. Every minibatch steps both by
deep mutual learning (``-al`` alpha, ``-bt`` beta)::

    L_local = alpha * CE(local) + (1 - alpha) * KL(p_meme || p_local)
    L_meme  = beta  * CE(meme)  + (1 - beta)  * KL(p_local || p_meme)

each KL reading the other model's prediction as a fixed target. KL is the divergence of the paper
(summed over the classes, averaged over the batch); PFLlib's ``nn.KLDivLoss()`` also averages over the
classes, which divides the distillation terms by the class count.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flcore.hyperparameters import FMLParams
from flcore.training.mutual import MutualLearningClient, distillation
from flcore.vmapped.support import Refused


def mutual_learning_loss(local_logits: torch.Tensor, meme_logits: torch.Tensor, y: torch.Tensor,
                         alpha: float, beta: float) -> torch.Tensor:
    """``L_local + L_meme`` (see the module docstring) of one batch: logits (B, C), labels (B,)."""
    local = alpha * F.cross_entropy(local_logits, y) + (1 - alpha) * distillation(local_logits, meme_logits)
    meme = beta * F.cross_entropy(meme_logits, y) + (1 - beta) * distillation(meme_logits, local_logits)
    return local + meme


class clientFML(MutualLearningClient):
    batched = Refused("it trains a private local model beside the shared meme model, each distilled from the "
                      "other's predictions every step")

    hparams: FMLParams

    def setup(self) -> None:
        super().setup()
        self.alpha = self.hparams.local_ce_weight
        self.beta = self.hparams.meme_ce_weight

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return mutual_learning_loss(self.private_model(x), self.model(x), y, self.alpha, self.beta)
