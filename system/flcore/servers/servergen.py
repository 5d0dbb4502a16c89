"""FedGen (Zhuangdi Zhu, Junyuan Hong, Jiayu Zhou, "Data-Free Knowledge Distillation for Heterogeneous
Federated Learning", ICML 2021).

Shared and averaged by sample count: the whole model (with ``-lf``, the head only: each client keeps its
feature extractor). Besides, the server learns a generator ``G(eps, y)`` of features (the head's input):
after each round, ``-se`` Adam steps (learning rate ``-glr``; ``-nd`` noise and ``-hd`` hidden units) on
the ensemble of the round's uploaded heads, ``min CE(sum_k a_k(y) head_k(G(eps, y)), y)`` with ``y`` drawn
from the uploaders' label counts and ``a_k(y)`` uploader k's share of label y's samples (eq. 4 of the paper,
its users' predictors weighted per label as in the authors' code). Every client receives the frozen
generator and the label distribution estimated from the counts uploaded so far, and adds the
cross-entropy of its head on generated features to its loss (``clientgen``). Each client reports the
received global model (under ``-lf``: the received head on its own feature extractor).

Where PFLlib's version differs, this follows the paper: the ensemble weighs each head per label (PFLlib by
the uploader's sample count, so a head that never saw a label still votes on it), ``p(y)`` is estimated from
the label counts clients upload (PFLlib reads every client's data at start), the noise is Gaussian (PFLlib
and the authors' code: uniform), clients use the generator only once it has been trained (PFLlib: from
round 0, on an untrained one), in eval mode. Defaults are the authors' MNIST configuration (noise 32,
hidden 256, learning rate 3e-4, 50 steps a round; PFLlib's 512, 512, 0.005, 1000). Not reproduced: the
authors' diversity loss on the generator and their decaying weights on the clients' terms, which the
paper's objectives do not have.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, Optional

import torch
from torch import nn
from torch.func import functional_call

from flcore.clients.clientgen import clientGen, clientGenSharedHead
from flcore.exchange import ClientUpdate
from flcore.hyperparameters import FedGenParams
from flcore.servers.serverbase import Server
from flcore.trainmodel.shapes import head_in_features
from flcore.training.feature_generator import FeatureGenerator, draw_labels_and_noise, generator_step, label_shares
from flcore.training.received import frozen_copy
from utils.datasets import DatasetInfo
from utils.seeding import model_seed

GENERATOR_STREAM = 0xFED6E  # the generator's initialisation; its noise draws use the next stream
HEAD_PREFIX = "head."


def head_function(template: nn.Module, update: ClientUpdate) -> Callable[[torch.Tensor], torch.Tensor]:
    """The head ``update`` uploaded, as a function of features: ``template`` (a module of the head's structure)
    run on the upload's own tensors."""
    if update.shared_path == "head":
        tensors: Dict[str, torch.Tensor] = dict(update.tensors)
    else:
        tensors = {name[len(HEAD_PREFIX):]: t for name, t in update.tensors.items() if name.startswith(HEAD_PREFIX)}
    return lambda features: functional_call(template, tensors, (features,), strict=True)


class FedGen(Server):
    """New clients (-nnc): the global model (under -lf: the global head on a fresh feature extractor), the
    generator and the label distribution, then -ften epochs of FedGen's own local update, generated features
    included."""
    whole_uploads_needed = "its generator is trained on the ensemble of the round's uploaded heads"
    client_class = clientGen
    persistent_attrs = ("feature_generator", "generator_optimizer", "generator_scheduler", "noise_generator",
                        "label_counts", "generator_trained")

    hparams: FedGenParams

    def __init__(self, config, hparams: FedGenParams, times: int, model: nn.Module, data: DatasetInfo,
                 store=None):
        if hparams.local_feature_extractor:
            self.client_class = clientGenSharedHead
        super().__init__(config, hparams, times, model, data, store)

    def setup(self) -> None:
        hp = self.hparams
        seed = model_seed(self.config.seed, GENERATOR_STREAM)
        # Drawn from its own stream on the CPU: the global generators and the device change nothing.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            generator = FeatureGenerator(hp.noise_dim, self.num_classes, hp.hidden_dim,
                                         head_in_features(self.global_model.head))
        self.feature_generator = generator.to(self.device)
        self.generator_optimizer = torch.optim.Adam(self.feature_generator.parameters(), lr=hp.generator_learning_rate)
        self.generator_scheduler = torch.optim.lr_scheduler.ExponentialLR(
            self.generator_optimizer, gamma=self.config.learning_rate_decay_gamma)
        self.noise_generator = torch.Generator().manual_seed(model_seed(self.config.seed, GENERATOR_STREAM + 1))
        # (N, C) each client's label counts, as last uploaded (zero for a client not heard from yet).
        self.label_counts = torch.zeros(len(self.clients), self.num_classes, dtype=torch.int64)
        self.generator_trained = False

    # ----- what clients receive ------------------------------------------------------------------
    def label_distribution(self) -> Optional[torch.Tensor]:
        """p(y) (C,), from the label counts uploaded so far; None before any."""
        total = self.label_counts.sum(dim=0).double()
        return (total / total.sum()).to(self.device) if total.sum() > 0 else None

    def generator_for_clients(self) -> Optional[FeatureGenerator]:
        return frozen_copy(self.feature_generator) if self.generator_trained else None

    def send_models(self) -> None:
        super().send_models()
        generator, distribution = self.generator_for_clients(), self.label_distribution()
        for client in self.clients:
            client.receive_generator(generator, distribution)

    def receive_new_client(self, client: clientGen) -> None:
        super().receive_new_client(client)
        client.receive_generator(self.generator_for_clients(), self.label_distribution())

    # ----- after training ------------------------------------------------------------------------
    def extras_problem(self, update: ClientUpdate) -> Optional[str]:
        counts = update.extras.get("label_counts")
        if not isinstance(counts, torch.Tensor) or tuple(counts.shape) != (self.num_classes,) \
                or counts.is_floating_point() or counts.is_complex():
            return f"its label counts are not {self.num_classes} whole numbers"
        if bool((counts < 0).any()) or int(counts.sum()) != update.num_samples:
            return f"its label counts do not add up to its {update.num_samples} samples"
        return None

    def receive_models(self) -> None:
        super().receive_models()
        for update in self.uploads:
            self.label_counts[update.client_id] = update.extras["label_counts"].cpu()

    def aggregate_parameters(self) -> None:
        self.train_generator()
        super().aggregate_parameters()

    def train_generator(self) -> None:
        """``-se`` steps of the generator on the ensemble of this round's uploaded heads."""
        if not self.uploads or self.hparams.generator_steps == 0:
            return
        template = copy.deepcopy(self.global_model.head).eval()
        heads = [head_function(template, update) for update in self.uploads]
        counts = torch.stack([update.extras["label_counts"] for update in self.uploads]).to(self.device)
        shares = label_shares(counts)
        distribution = counts.sum(dim=0)
        # BatchNorm needs two samples to normalise a batch.
        batch = max(2, self.config.batch_size)
        for _ in range(self.hparams.generator_steps):
            labels, noise = draw_labels_and_noise(distribution, batch, self.hparams.noise_dim, self.noise_generator,
                                                  self.device)
            generator_step(self.feature_generator, self.generator_optimizer, heads, shares, labels, noise)
        if self.config.learning_rate_decay:
            self.generator_scheduler.step()
        self.generator_trained = True
