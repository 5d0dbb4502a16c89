"""FedLAG. The maths and the rule: ``conflict.py`` (the conflict score, pure tensor maths), ``settings.py``
(``LagSettings``, the knobs and their ``--lag_*`` flags), ``selector.py`` (``LayerSelector``: the evidence
across rounds and the rule that picks the personal layers), ``groups.py`` (``--lag_share groups``: update
profiles and the groups they give). On a server: ``updates.py`` (the round's update matrix),
``candidates.py`` (the layers to choose among, and the base method's own), ``sharing.py`` (the group models
and what each client receives of them), ``records.py`` (checkpoint state and ``lag_*`` results) and
``mixin.py`` (``LayerConflictMixin``, the glue that adds all of it to any parameter-sharing server).
``client_tensors.py`` reads a client's tensors; ``flagfields.py`` is the generic flag declaration the
settings, and the rest of the project, are written in.

Depends on torch only, so the folder can be copied into an upstream PFLlib checkout unchanged.
"""
from .conflict import (Layer, LayerEvidence, build_layers, conflict_count, conflict_scores, layer_evidence,
                       pairwise_cosines, top_k_layers)
from .mixin import LayerConflictMixin, with_layer_conflict
from .selector import LayerSelector, evidence_choice, top_k_positive
from .settings import LagError, LagSettings
from .sharing import GroupSharing

__all__ = ["Layer", "LayerEvidence", "build_layers", "conflict_count", "conflict_scores", "layer_evidence", "pairwise_cosines",
           "top_k_layers", "LagError", "LagSettings", "LayerSelector", "evidence_choice", "top_k_positive",
           "LayerConflictMixin", "with_layer_conflict", "GroupSharing"]
