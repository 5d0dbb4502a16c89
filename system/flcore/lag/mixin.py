"""``LayerConflictMixin``: FedLAG's layer personalisation on top of any parameter-sharing server.

Put it first in the bases (``class FedRepLAG(LayerConflictMixin, FedRep)``, or ``with_layer_conflict(FedRep)``);
the class records the base method's server class as ``lag_base``. The mixin is glue: it intercepts the hooks
every server of this project has, calls the base method's own version of each, and hands the work to one
object per concern:

* ``personal_names``: the personal layers (parameters, and the buffers of their modules) join what the base
  method keeps personal, so the base server's broadcast leaves them out: a client never loads what is its
  own (inside an upstream PFLlib checkout, whose broadcast cannot leave anything out, the adapter in
  ``patches/`` puts them back after it instead).
* ``send_models``: the base method's own delivery (one that delivers no payloads gets the group models
  first). With ``--lag_signal delta`` the selected clients' starting parameters are then taken into the
  update matrix (:class:`~.updates.UpdateMatrix`).
* ``receive_models``: after the base method has picked the round's ``uploads`` (one ``ClientUpdate`` per
  uploader: tensors by name under the update's ``shared_path``, so an upload of only ``model.base`` maps
  to ``base.*``), the per-layer updates are scored (``conflict.py``), the personal set is chosen
  (:class:`~.selector.LayerSelector`) and, with ``--lag_share groups``, the groups updated. With
  ``--lag_upload sketch`` the layers personal this round are scored from a count sketch of each update
  (:mod:`.sketch`), and the uploads lose their tensors before anything else reads them.
* ``aggregate_parameters``: the base method's own; the server still averages every shared tensor,
  including the personal ones (unless sketched), which initialise clients that never held a copy (new
  clients). With ``--lag_share groups`` the group models are then formed (:class:`~.sharing.GroupSharing`)
  and held: ``personal_payload`` gives each member its groups' models, which the next round's ``send_models``
  delivers as part of its ``payload``, and ``finish`` delivers those of the last round. With
  ``--lag_share check`` the server also holds its average of each personal layer, and each selected client,
  before it receives its payload, checks its own copy against its group's and that average on its held-out
  data (:class:`~.checked_copies.CheckedCopies`): its payload carries the copy it took.

Only tensors the base method uploads (and the client ``shares``) are ranked (``candidates.py``): the base
method's own personal parts stay personal and count towards K, so FedRep+LAG with K = 1 is FedRep and K = 2
adds one shared layer. Contracts relied on: the base server's hooks above, ``personal_payload`` and
``send_personal_payloads``, ``extra_state``, ``get_state`` / ``set_state``, ``result_arrays`` /
``result_attrs``, ``finish``, ``self.lag_settings()`` (the ``--lag_*`` values), ``self.clients`` with ``.id``
and ``.model``, ``self.selected_clients``, ``receive_models`` filling ``self.uploads`` (objects shaped like
:class:`~flcore.exchange.ClientUpdate`: ``client_id``, ``tensors``, ``gradients``, ``full_name``) and
``upload_needs_gradients``. This project's ``Server`` has them all; in a PFLlib checkout ``UpstreamCompat``
(``patches/``) supplies what upstream lacks.

This module imports only torch and the other modules of ``lag/``, so ``lag/`` drops into a PFLlib checkout
unchanged.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from .candidates import TensorNames, candidate_layers, declared_shared_names, own_personal_layers, uploaded_names
from .checked_copies import CheckedCopies
from .client_tensors import model_of, model_tensors
from .conflict import Layer
from .groups import UpdateProfiles
from .records import LagRecords
from .selector import LayerSelector
from .sketch import count_sketch, sketch_map, sketch_size
from .settings import LagError, LagSettings
from .sharing import GroupSharing
from .updates import UpdateMatrix

State = Dict[str, torch.Tensor]


class LayerConflictMixin(LagRecords):
    """Keeps, every round, the layers whose client updates conflict most as personal layers."""

    lag_base: Optional[type] = None  # the base method's server class

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        bases = cls.__bases__
        if LayerConflictMixin in bases and "lag_base" not in vars(cls):
            # The base method is the last class listed after the mixin (an adapter may sit between them).
            after = bases[bases.index(LayerConflictMixin) + 1:]
            cls.lag_base = after[-1] if after else None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lag: LagSettings = self.lag_settings()
        if self.lag.upload == "sketch" and getattr(self, "whole_uploads_needed", None):
            raise LagError(f"--lag_upload sketch keeps the personal layers' tensors on the clients, and "
                           f"{self.lag_method} needs them ({self.whole_uploads_needed}): use --lag_upload all")
        self.lag_selector: Optional[LayerSelector] = None  # built once the candidate layers are known
        self.lag_sharing: Optional[GroupSharing] = None    # --lag_share groups or check, with the selector
        self.lag_check: Optional[CheckedCopies] = None     # --lag_share check: each client's choice of copy
        self.lag_updates = UpdateMatrix()
        self._lag_unscored_before = 0                      # rounds that ended before the layers were known
        self._lag_names: Optional[TensorNames] = None
        self._lag_seed = int(getattr(getattr(self, "config", None), "seed", 0) or 0)
        self._lag_sketch_maps: Dict[int, tuple] = {}       # --lag_upload sketch: layer -> (dim, buckets, signs)
        shared = declared_shared_names(self.clients[0]) if self.clients else None
        if shared is not None:  # what the base method shares is declared before any round: check K now
            self._lag_start(self.clients[0], shared)

    @property
    def lag_method(self) -> str:
        """The base method's name, for messages."""
        return self.lag_base.__name__ if self.lag_base is not None else "the base method"

    @property
    def lag_layers(self) -> Optional[List[Layer]]:
        return None if self.lag_selector is None else self.lag_selector.layers

    @property
    def lag_personal(self) -> Tuple[int, ...]:
        return () if self.lag_selector is None else self.lag_selector.personal

    @property
    def lag_profiles(self) -> Optional[UpdateProfiles]:
        return None if self.lag_sharing is None else self.lag_sharing.profiles

    def _lag_start(self, client, shared: FrozenSet[str]) -> None:
        """Build the selector on the layers the base method shares (``shared``: full names, as ``client``'s
        model names them); it refuses a K that leaves none shared."""
        candidates = candidate_layers(client, shared, self.lag.granularity)
        self.lag_selector = LayerSelector(self.lag, candidates, self.lag_method,
                                          own_personal_layers(client, candidates, self.lag.granularity),
                                          seed=self._lag_seed)
        if self.lag.share in ("groups", "check"):
            if len(self.clients) < 2:
                raise LagError(f"--lag_share {self.lag.share} shares a layer within groups of clients, and this run "
                               f"has {len(self.clients)}: give -nc >= 2 or --lag_share own")
            self.lag_sharing = self._lag_new_sharing()
        if self.lag.share == "check":
            self.lag_check = self._lag_new_check()
        self._lag_say_notes()

    def _lag_new_sharing(self) -> GroupSharing:
        return GroupSharing(len(self.clients), self.lag.group_cosine, self.lag.xi,
                            getattr(self.clients[0], "shared_path", ""))

    def _lag_new_check(self) -> CheckedCopies:
        if self.lag.check_data == "held_out" and getattr(self.clients[0], "val_data", None) is None:
            raise LagError("--lag_share check compares copies on data held out of training: give --val_ratio "
                           "> 0 (e.g. 0.1), or --lag_check_data train")
        return CheckedCopies(len(self.clients), self.lag.decay, self.lag.margin, self.lag.check_data,
                             getattr(self.clients[0], "shared_path", ""))

    def _lag_say_notes(self) -> None:
        """Print, once each, what the selector wants the user to hear."""
        while self.lag_selector.notes:
            print(f"note: {self.lag_selector.notes.pop(0)}")

    # ----- what clients receive -------------------------------------------------------------------------
    def personal_names(self) -> FrozenSet[str]:
        """The base method's own (none for most) and the personal layers', with their modules' buffers:
        the base server leaves them out of what it broadcasts, so no client ever loads them."""
        own = super().personal_names()
        if not self.lag_personal:
            return own
        return own | frozenset(self._lag_with_buffers(self.lag_personal_names()))

    def personal_payload(self, client_id: int) -> Optional[State]:
        """With ``--lag_share groups``: a group member's groups' models of the personal layers."""
        own = super().personal_payload(client_id)
        if self.lag_check is not None:
            groups = self.lag_check.payload(client_id, self.lag_personal, self._lag_tensors_of, self._lag_group_copy)
        else:
            groups = None if self.lag_sharing is None else self.lag_sharing.payload(client_id)
        if not groups:
            return own
        return groups if not own else {**own, **groups}

    def _lag_group_copy(self, layer: int, client_id: int) -> Optional[Tuple[int, State]]:
        return self.lag_sharing.copy_of(layer, client_id, self._lag_tensors_of(layer))

    def _lag_tensors_of(self, layer: int) -> Tuple[str, ...]:
        return self._lag_with_buffers(self.lag_layers[layer].tensors)

    def send_models(self):
        if self.lag_check is not None:  # the selected clients choose their copies before they receive them
            self.lag_check.check(self.selected_clients, self.lag_personal, self._lag_tensors_of, self._lag_group_copy,
                                 self.lag_sharing.members_of, model_tensors, model_of(self.clients[0]))
        if self.lag_sharing is not None and not self._lag_base_delivers_payloads():
            # The base method delivers its own way, leaving the personal layers out: the group models come first.
            self.send_personal_payloads()
        super().send_models()
        if self.lag.signal == "delta":
            self.lag_updates.start(list(self.selected_clients))

    def _lag_base_delivers_payloads(self) -> bool:
        """Whether the ``send_models`` under the mixin delivers every client its ``payload`` (the base server's
        says so); an override may deliver otherwise, so it gets the group models before its own delivery."""
        return bool(getattr(super().send_models, "delivers_payloads", False))

    def finish(self):
        """The last round's group models reach their members before anything reads the clients after the
        rounds (FedBABU's fine-tuning, the new clients of a method that reads the others)."""
        if self.lag_sharing is not None:
            self.send_personal_payloads()
        super().finish()

    # ----- upload: base behaviour, then score and choose ------------------------------------------------
    def upload_needs_gradients(self) -> bool:
        """``last_batch`` scores the last minibatch's gradients, so the uploads must carry them."""
        return self.lag.signal == "last_batch" or super().upload_needs_gradients()

    def receive_models(self):
        super().receive_models()
        uploads = list(self.uploads)
        if self.lag_selector is None and uploads:  # a client that declares nothing: its upload says
            self._lag_start(self.clients[0], uploaded_names(uploads[0]))
        if self.lag_selector is None:
            self._lag_unscored_before += 1   # nothing uploaded yet: the round still gets its row
            return
        self.lag_updates.use_layers(self.clients[0], self.lag_layers)
        rows = self.lag_updates.collect(uploads, self.lag.signal, self.clients[0])
        if self.lag.upload == "sketch" and self.lag_personal:
            self._lag_keep_personal_home(rows)
        self.lag_selector.observe(self.lag_updates.evidence(rows, self.lag.xi), uploads=len(rows))
        if self.lag_sharing is not None:
            self.lag_sharing.regroup(self.lag_updates.layer_updates(self.lag_personal, rows),
                                     list(self.lag_updates.scored), self.lag_personal, len(self.lag_layers))
        if self.lag_check is not None:
            self.lag_check.choices.keep_layers(self.lag_personal)
            self.lag_check.choices.end_round(len(self.lag_layers))
        self._lag_say_notes()

    def _lag_keep_personal_home(self, rows: Sequence[int]) -> None:
        """``--lag_upload sketch``: what the clients sent of the layers personal this round is a count sketch of
        each one's update (:mod:`.sketch`; the update matrix holds it in place of the update) and none of their
        tensors, which the uploads lose before anything else reads them (aggregation, ``-dlg``, the base's
        extras). Simulated at the server's edge: the clients compute the same sketches from the same updates."""
        self.lag_updates.sketch_layers(self.lag_personal, rows, self._lag_sketch)
        kept = frozenset(self._lag_with_buffers(self.lag_personal_names()))
        self.uploads = [replace(u, tensors={n: t for n, t in u.tensors.items() if u.full_name(n) not in kept},
                                gradients={n: t for n, t in u.gradients.items() if u.full_name(n) not in kept})
                        for u in self.uploads]

    def _lag_sketch(self, layer: int, updates: torch.Tensor) -> torch.Tensor:
        size = updates.shape[1]
        if layer not in self._lag_sketch_maps:
            dim = sketch_size(size, self.lag.sketch_dim)
            self._lag_sketch_maps[layer] = (dim, *sketch_map(size, dim, self._lag_seed, layer))
        dim, buckets, signs = self._lag_sketch_maps[layer]
        return count_sketch(updates, buckets, signs, dim)

    def aggregate_parameters(self):
        super().aggregate_parameters()
        if self.lag_sharing is None:
            return
        if self.uploads and self.lag_sharing.history:
            self.lag_sharing.share(self.lag_personal, self._lag_tensors_of,
                                   lambda i: model_tensors(self.clients[i]), [c.train_samples for c in self.clients])
            if self.lag_check is not None:
                self.lag_check.hold_everyones(self.lag_personal, self._lag_tensors_of, {
                    **dict(self.global_model.named_parameters()), **dict(self.global_model.named_buffers())})
        else:
            self.lag_sharing.clear()

    def lag_update_of(self, client_id: int) -> State:
        """The last scored update ``h_u`` of one client, by parameter name (for inspection and tests)."""
        return self.lag_updates.update_of(client_id)

    # ----- naming ---------------------------------------------------------------------------------------
    def lag_personal_names(self) -> List[str]:
        """Full parameter names currently kept personal."""
        return [] if self.lag_selector is None else self.lag_selector.personal_names()

    def _lag_with_buffers(self, parameters: Sequence[str]) -> Tuple[str, ...]:
        if self._lag_names is None:
            self._lag_names = TensorNames(self.clients[0])
        return self._lag_names.with_buffers(parameters)


def with_layer_conflict(server_class: type, name: Optional[str] = None) -> type:
    """``X+LAG``: a subclass of ``server_class`` with :class:`LayerConflictMixin` first in its MRO."""
    if issubclass(server_class, LayerConflictMixin):
        raise LagError(f"{server_class.__name__} already personalises conflicting layers")
    class_name = (name or f"{server_class.__name__}+LAG").replace("+", "_")
    return type(class_name, (LayerConflictMixin, server_class),
                {"__doc__": server_class.__doc__, "lag_base": server_class})
