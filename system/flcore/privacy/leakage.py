"""``-dlg``: the server plays the attacker of Deep Leakage from Gradients on the uploads it receives.

In a round r with ``r % -dlgg == 0`` (PFLlib's evaluation-gap convention: round 0 is one), once the uploads
are received and before anything is aggregated, the server attacks each upload it received (after ``-cdr``
and ``-ts``) with what an honest-but-curious server holds:

* the model the client started from: the server's global model with the client's payload loaded into the
  shared module, the payload being what :meth:`Server.payload` sent it this round (taken right after
  ``send_models``, before a method's scoring can change what the next payload holds). A method that delivers
  its own way instead of payloads (FedALA, FedAMP ...: docs/command-line.md) gets its broadcast here;
* the observed gradient: for each parameter of the shared module that the client uploaded and whose start
  the server sent, ``(start - uploaded) / (-lr * steps)``, ``steps`` being the client's SGD steps of the
  round (``-ls`` epochs of ``max(1, n // -lbs)`` minibatches). For one step of plain SGD this is the gradient
  itself; for several it is their mean, the gradient of no one minibatch (and under ``-ld`` the rate is
  not followed as it decays, nor a method's own optimiser: the attacker assumes plain SGD at ``-lr``). Buffers (BatchNorm's statistics) are no
  gradients. A tensor not uploaded (FedPer's head) or whose start was not sent (a layer FedLAG keeps
  personal this round, which its clients upload for the scoring but never receive) is left out of the
  match: its gradient is unseen, and the model runs through the server's own value of it;
* the targets: the client's first ``-bnpc`` minibatches of ``-lbs`` training samples in file order (all its
  samples as one batch when it holds fewer than ``-lbs``), each attacked on its own with a dummy batch of
  its size. The client trained on shuffled minibatches, so these are not the batches its steps saw: a
  fixed, reproducible target, the simplification PFLlib makes too.

Each batch's reconstruction is scored against the real batch (PSNR and SSIM on [0, 1] pixels,
:mod:`flcore.privacy.image_quality`; each real image against the reconstruction paired with it) and the round
records the mean over every attacked image. Randomness: each attack draws its start from a generator of its
own, seeded by ``--seed``, the client id, the round and the batch, and the global generators are restored
after it, so training draws exactly what it draws without ``-dlg``.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple

import numpy as np
import torch
from torch import nn

from flcore.aggregation import copy_into
from flcore.exchange import ClientUpdate
from flcore.privacy.dlg import parameters_in_loss, reconstruct
from flcore.privacy.image_quality import match_images, psnr, ssim, to_unit_pixels
from utils import progress
from utils.client_data import ClientData

_STREAM = 0xD16  # keeps the attacks' generators apart from every other seeded stream of the run
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def attack_generator(seed: int, client_id: int, rnd: int, batch: int) -> torch.Generator:
    """The generator of one attack's random start: its own stream, whatever else the run draws."""
    state = np.random.SeedSequence([seed % 2**32, _STREAM, client_id, rnd, batch]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> 1))


def sgd_steps(samples: int, batch_size: int, epochs: int) -> int:
    """A client's minibatch steps in one local training: ``epochs`` times the batches of
    :meth:`~utils.client_data.ClientData.train_batches` (full batches only, or one batch of all its samples)."""
    return epochs * max(1, samples // batch_size)


def first_batches(data: ClientData, batch_size: int, count: int) -> List[torch.Tensor]:
    """The inputs of ``data``'s first ``count`` minibatches of ``batch_size`` samples in file order (as many
    full ones as it holds, or one of all its samples when it holds fewer than ``batch_size``)."""
    n = len(data)
    starts = range(0, max(n - batch_size + 1, 1), batch_size)
    return [data.inputs(data.x[s:s + batch_size]) for s in list(starts)[:count]]


def observed_gradient(start: Mapping[str, torch.Tensor], update: ClientUpdate, parameters: Mapping[str, nn.Parameter],
                      scale: float) -> Dict[str, torch.Tensor]:
    """``(start - uploaded) / scale`` by full parameter name, for each parameter of the model (``parameters``,
    by full name) that ``update`` carries and ``start`` (names relative to the shared module) holds."""
    observed = {}
    for name, after in update.tensors.items():
        full = update.full_name(name)
        if name in start and full in parameters and after.shape == parameters[full].shape:
            observed[full] = (start[name].to(after.dtype) - after) / scale
    return observed


def attack_model(global_model: nn.Module, shared_path: str, start: Mapping[str, torch.Tensor],
                 observed: Mapping[str, torch.Tensor]) -> nn.Module:
    """A copy of ``global_model`` as the client started the round: ``start`` (what it was sent) in its shared
    module, in training mode as clients train, but without dropout, which would make the attack's objective
    random and draw from the global generator; only the parameters in ``observed`` require gradients."""
    model = copy.deepcopy(global_model)
    with torch.no_grad():
        copy_into(model.get_submodule(shared_path), start)
    model.train()
    for module in model.modules():
        if isinstance(module, _DROPOUT):
            module.eval()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in observed)
    return model


@dataclass(frozen=True)
class BatchScore:
    """One attacked batch: the PSNR and SSIM of each of its images."""
    psnr: torch.Tensor
    ssim: torch.Tensor


def score(reconstructed: torch.Tensor, real: torch.Tensor) -> BatchScore:
    """Each real image against the reconstruction paired with it (:func:`match_images`), on [0, 1] pixels."""
    rebuilt, truth = to_unit_pixels(reconstructed), to_unit_pixels(real)
    rebuilt = rebuilt[match_images(rebuilt, truth)]
    return BatchScore(psnr(rebuilt, truth), ssim(rebuilt, truth))


@dataclass(frozen=True)
class RoundLeakage:
    """What one evaluated round records: means over every attacked image of every attacked client."""
    psnr: float
    ssim: float
    batches: int       # batches attacked
    tensors: float     # mean number of parameter tensors whose update the attacker matched, per client
    seen: float        # mean fraction of the model's parameter values among them, per client

    def line(self, rnd: int, clients: int) -> str:
        if not self.batches:
            return f"DLG round {rnd}: no upload to attack"
        return (f"DLG round {rnd}: PSNR {self.psnr:.2f} dB | SSIM {self.ssim:.4f} | {self.batches} batch(es) of "
                f"{clients} client(s) | the update of {self.tensors:.1f} parameter tensors seen "
                f"({100 * self.seen:.1f}% of the model's parameters)")


class LeakageEvaluation:
    """The ``-dlg`` evaluation of one run (inactive without the flag)."""

    def __init__(self, config, active: bool):
        self.active = active
        self.gap = int(config.dlg_gap)
        self.batches = int(config.batch_num_per_client)
        self.seed = int(config.seed)
        self.learning_rate = float(config.local_learning_rate)
        self.batch_size = int(config.batch_size)
        self.epochs = int(config.local_epochs)
        self.num_classes = config.num_classes  # resolved from the dataset before any server is built
        self.starts: Dict[int, Mapping[str, torch.Tensor]] = {}  # this round's payload of each selected client

    def due(self, rnd: int) -> bool:
        return self.active and rnd % self.gap == 0

    def remember(self, payloads: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        """What each selected client was sent this round, by client id (tensors nobody writes)."""
        self.starts = dict(payloads)

    def attack_round(self, rnd: int, global_model: nn.Module, shared_path: str, uploads: List[ClientUpdate],
                     train_data: Mapping[int, ClientData]) -> RoundLeakage:
        """Attack every upload of round ``rnd`` whose start was remembered (``train_data``: each uploader's
        training split, by client id); forgets the starts."""
        psnrs, ssims, tensors, seen, batches = [], [], [], [], 0
        total = sum(p.numel() for p in global_model.parameters())
        for update in uploads:
            start = self.starts.get(update.client_id)
            scores, matched = [], {}
            if start is not None:
                scores, matched = self.attack_client(rnd, global_model, shared_path, start, update,
                                                     train_data[update.client_id])
            progress.current().advance()
            if not scores:
                continue
            batches += len(scores)
            psnrs += [s.psnr for s in scores]
            ssims += [s.ssim for s in scores]
            tensors.append(len(matched))
            seen.append(sum(t.numel() for t in matched.values()) / max(total, 1))
        self.starts = {}
        if not batches:
            return RoundLeakage(math.nan, math.nan, 0, math.nan, math.nan)
        return RoundLeakage(float(torch.cat(psnrs).mean()), float(torch.cat(ssims).mean()), batches,
                            float(np.mean(tensors)), float(np.mean(seen)))

    def attack_client(self, rnd: int, global_model: nn.Module, shared_path: str, start: Mapping[str, torch.Tensor],
                      update: ClientUpdate, data: ClientData) -> Tuple[List[BatchScore], Dict[str, torch.Tensor]]:
        """The scores of each of the client's attacked batches, and the observed gradient matched (by full
        parameter name; nothing to attack when empty)."""
        steps = sgd_steps(len(data), self.batch_size, self.epochs)
        if steps == 0:
            return [], {}
        parameters = dict(global_model.named_parameters())
        observed = observed_gradient(start, update, parameters, self.learning_rate * steps)
        if not observed:
            return [], {}
        model = attack_model(global_model, shared_path, start, observed)
        batches = first_batches(data, self.batch_size, self.batches)
        scores = []
        devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices):  # nothing here may move the run's own generators
            used = parameters_in_loss(model, list(observed), batches[0].shape, self.num_classes)
            observed = {name: observed[name] for name in used}
            for index, real in enumerate(batches if observed else []):
                found = reconstruct(model, observed, real.shape, self.num_classes,
                                    attack_generator(self.seed, update.client_id, rnd, index))
                scores.append(score(found.inputs, real))
        return scores, observed
