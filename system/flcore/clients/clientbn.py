"""FedBN's client (Li et al., "FedBN", ICLR 2021): every tensor is exchanged except those of
normalisation layers (their affine parameters and their running statistics), which stay local.

Normalisation layers are recognised by module type, not by a ``"bn"`` substring in the name as
PFLlib does (which misses, e.g., a torchvision ``downsample.1`` BatchNorm and would catch any layer
whose name merely contains ``bn``).
"""
from __future__ import annotations

from typing import FrozenSet

from torch import nn

from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client

# _NormBase covers every BatchNorm and InstanceNorm variant (lazy and synchronised ones included).
NORMALISATION_TYPES = tuple(t for t in (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm,
                                        getattr(nn, "RMSNorm", None)) if t is not None)


def normalisation_tensor_names(module: nn.Module) -> FrozenSet[str]:
    """Names (relative to ``module``) of every parameter and buffer owned by a normalisation layer."""
    names = set()
    for module_name, sub in module.named_modules():
        if isinstance(sub, NORMALISATION_TYPES):
            prefix = f"{module_name}." if module_name else ""
            names.update(prefix + n for n, _ in sub.named_parameters(recurse=False))
            names.update(prefix + n for n, _ in sub.named_buffers(recurse=False))
    return frozenset(names)


class clientBN(Client):
    batched = PLAIN  # BatchNorm statistics are per client (stacked buffers)

    def setup(self) -> None:
        self.local_tensor_names = normalisation_tensor_names(self.shared_module())

    def shares(self, name: str) -> bool:
        return name not in self.local_tensor_names
