"""FedLAG. The maths and the rule: ``conflict.py`` (the conflict score, pure tensor maths), ``settings.py``
(``LagSettings``, the knobs and their ``--lag_*`` flags), ``choice.py`` (the rules that pick the personal
layers from the evidence, pure functions), ``selector.py`` (``LayerSelector``: the evidence across rounds,
the choice it makes with those rules and their history), ``groups.py`` (``--lag_share groups``: update
profiles and the groups they give). On a server: ``updates.py`` (the round's update matrix),
``candidates.py`` (the layers to choose among, and the base method's own), ``sharing.py`` (the group models
and what each client receives of them), ``records.py`` (checkpoint state and ``lag_*`` results) and
``mixin.py`` (``LayerConflictMixin``, the glue that adds all of it to any parameter-sharing server).
``client_tensors.py`` reads a client's tensors.

Depends on torch and, for the settings' flags, ``utils/flagfields.py`` (standard library) only, so the folder
can be copied into an upstream PFLlib checkout unchanged (the patch installs that one file beside it).
"""
from .choice import evidence_choice, top_k_positive
from .conflict import (Layer, LayerEvidence, build_layers, conflict_count, conflict_scores, layer_evidence,
                       pairwise_cosines, top_k_layers)
from .mixin import LayerConflictMixin, with_layer_conflict
from .selector import LayerSelector
from .settings import LagError, LagSettings
from .sharing import GroupSharing

__all__ = ["Layer", "LayerEvidence", "build_layers", "conflict_count", "conflict_scores", "layer_evidence", "pairwise_cosines",
           "top_k_layers", "LagError", "LagSettings", "LayerSelector", "evidence_choice", "top_k_positive",
           "LayerConflictMixin", "with_layer_conflict", "GroupSharing"]
