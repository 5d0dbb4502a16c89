"""Which layers FedLAG chooses among, and which the base method keeps personal itself.

The candidates are the layers built from the parameters the base method shares, in the full model's
order, named by their full names in the client's model: from what a client of this project declares it
shares (``client.shared_tensors()`` under its ``shared_path``), known before any round, or from an upload
(``update.full_name``), for PFLlib's clients, which declare nothing. The base method's own personal
layers count towards K (:class:`~.selector.LayerSelector`). A personal layer carries the buffers of its
module (BatchNorm's statistics follow it; buffers are never scored). Imports only torch.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from torch import nn

from .client_tensors import model_of
from .conflict import Layer, build_layers, with_module_buffers

_NORMALISATION = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def declared_shared_names(client) -> Optional[FrozenSet[str]]:
    """Full names of what ``client`` shares, from its own declaration (no upload, no training); None for a
    client that declares nothing (PFLlib's: its uploads say what it shares)."""
    declared = getattr(client, "shared_tensors", None)
    if not callable(declared):
        return None
    path = getattr(client, "shared_path", "")
    return frozenset(f"{path}.{name}" if path else name for name in declared())


def uploaded_names(update) -> FrozenSet[str]:
    """Full names of the tensors an upload carries (``update.full_name`` maps them from its shared module)."""
    return frozenset(update.full_name(name) for name in update.tensors)


def candidate_layers(client, shared: Iterable[str], granularity: str) -> List[Layer]:
    """The layers built from the parameters in ``shared`` (full names), in ``client.model``'s order."""
    shared = set(shared)
    ordered = [n for n, _ in model_of(client).named_parameters() if n in shared]
    return build_layers(ordered, granularity)


def own_personal_layers(client, candidates: Sequence[Layer], granularity: str) -> List[str]:
    """The layers the base method keeps personal by design, which K counts: the trainable parameters of
    ``client.model`` it does not share (FedRep's head), and the modules a client names in
    ``personal_layer_attrs`` (FedROD's personal head, which lives beside ``model``). Normalisation
    layers are not counted (FedBN keeps them personal; they rescale features, they are not a layer
    FedLAG would choose instead of a convolution). Upstream FedRep freezes its head after the head
    epochs, so "trained" also takes the parameters a client optimiser holds."""
    shared = {name for layer in candidates for name in layer.tensors}
    trained = _trained_parameter_ids(client)
    own = [n for n, p in _feature_parameters(model_of(client)) if id(p) in trained and n not in shared]
    for attr in getattr(client, "personal_layer_attrs", ()):
        own += [f"{attr}.{n}" for n, _ in _feature_parameters(getattr(client, attr))]
    return [layer.name for layer in build_layers(own, granularity)]


class TensorNames:
    """Parameter names and their modules' buffers, by full name, from one client's model. Cached: reading
    a client's model checks a working copy out, and the structure never changes."""

    def __init__(self, client):
        self.client = client
        self._with_buffers: Dict[Tuple[str, ...], Tuple[str, ...]] = {}

    def with_buffers(self, parameters: Sequence[str]) -> Tuple[str, ...]:
        """``parameters`` and the buffers of their modules."""
        key = tuple(parameters)
        if key not in self._with_buffers:
            self._with_buffers[key] = tuple(with_module_buffers(model_of(self.client), list(key)))
        return self._with_buffers[key]


def _trained_parameter_ids(client) -> set:
    """Parameters the client trains: those that take gradients now, and those any of its optimisers
    hold (a method may freeze a part between phases of local training)."""
    ids = {id(p) for p in model_of(client).parameters() if p.requires_grad}
    for value in vars(client).values():
        groups = getattr(value, "param_groups", None)  # an optimiser, torch's or one shaped like it
        if isinstance(groups, list):
            ids.update(id(p) for group in groups for p in group["params"])
    return ids


def _feature_parameters(module: nn.Module):
    """``named_parameters()`` without those of normalisation modules."""
    for prefix, sub in module.named_modules():
        if isinstance(sub, _NORMALISATION):
            continue
        for name, param in sub.named_parameters(recurse=False):
            yield (f"{prefix}.{name}" if prefix else name), param
