"""FedLAG: ``conflict.py`` (the conflict score, pure tensor maths) and ``mixin.py``
(``LayerConflictMixin``, which adds layer personalisation to any parameter-sharing server).

Depends on torch only, so the folder can be copied into an upstream PFLlib checkout unchanged.
"""
from .conflict import Layer, build_layers, conflict_count, conflict_scores, pairwise_cosines, top_k_layers
from .mixin import LagError, LagSettings, LayerConflictMixin, with_layer_conflict

__all__ = ["Layer", "build_layers", "conflict_count", "conflict_scores", "pairwise_cosines", "top_k_layers",
           "LagError", "LagSettings", "LayerConflictMixin", "with_layer_conflict"]
