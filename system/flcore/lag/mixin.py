"""``LayerConflictMixin``: FedLAG's layer personalisation on top of any parameter-sharing server.

Put it first in the bases (``class FedRepLAG(LayerConflictMixin, FedRep)``). It only intercepts the
hooks every PFLlib-style server has, and calls the base method's own version of each:

* ``personal_names``: the personal layers (parameters, and the buffers of their modules) join what the
  base method keeps personal, so the base server's broadcast leaves them out: a client never loads
  what is its own (inside an upstream PFLlib checkout, whose broadcast cannot leave anything out, the
  adapter in ``patches/`` puts them back after it instead).
* ``send_models``: the base broadcast runs unchanged. With ``--lag_signal delta``
  the selected clients' starting parameters are written into one (clients x parameters) matrix here;
  at upload each row becomes the update ``theta^(r,E) - theta^(r)`` in place, and every layer is scored
  on a column view of that matrix (no per-layer or per-client copies: 100 clients x 1M parameters
  cost one 400 MB buffer and one m x m Gram matrix per layer).
* ``receive_models``: after the base method has picked the round's ``uploads`` (one ``ClientUpdate``
  per uploader: tensors by name under the update's ``shared_path``, so an upload of only ``model.base``
  maps to ``base.*``), the per-layer updates are scored (``conflict.py``) and the personal set is chosen.
* ``aggregate_parameters``: the base method's own; the server still averages every shared tensor,
  including the personal ones, which initialise clients that never held a copy (new clients). With
  ``--lag_share groups`` each personal layer is then averaged within each group of clients whose updates
  of it agree (``groups.py``), over every member's latest copy weighted by its training samples, and
  every member of the group (sampled or not) receives that average; a client alone keeps its own copy.

Only tensors the base method uploads (and the client ``shares``) are ranked: the base method's own
personal parts stay personal and count towards K (``LayerSelector``), so FedRep+LAG with K = 1 is
FedRep and K = 2 adds one shared layer. Contracts relied on: ``self.lag_settings()``, the ``--lag_*``
values (this project's ``Server`` returns its config's; in a PFLlib checkout ``UpstreamCompat`` reads
them from ``args``), ``self.clients`` with ``.id`` and ``.model``, ``self.selected_clients``,
``receive_models`` filling ``self.uploads`` (objects shaped like :class:`~flcore.exchange.ClientUpdate`:
``client_id``, ``tensors``, ``gradients``, ``full_name``; in a PFLlib checkout ``UpstreamCompat`` builds
them from upstream's ``uploaded_ids`` / ``uploaded_models``), and ``upload_needs_gradients``.

This module imports only torch and the other modules of ``lag/``, so ``lag/`` drops into a PFLlib
checkout unchanged.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .client_tensors import model_snapshot, model_tensors, write_model_tensors
from .conflict import Layer, build_layers, layer_evidence_in_spans, with_module_buffers
from .groups import UpdateProfiles, group_members, sample_weighted_average
from .selector import LayerSelector
from .settings import LagError, LagSettings

State = Dict[str, torch.Tensor]


class LayerConflictMixin:
    """Keeps, every round, the layers whose client updates conflict most as personal layers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lag: LagSettings = self.lag_settings()
        self.lag_selector: Optional[LayerSelector] = None  # built once the candidate layers are known
        self._lag_unscored_before = 0                        # rounds that ended before that
        # Transient, rebuilt every round: flat-parameter layout, per-layer column spans, update matrix.
        self._lag_columns: Optional[Dict[str, Tuple[int, int]]] = None
        self._lag_spans: List[List[Tuple[int, int]]] = []
        self._lag_matrix: Optional[torch.Tensor] = None
        self._lag_rows: Dict[int, int] = {}     # client id -> its row of the update matrix this round
        self._lag_starts: Dict[int, State] = {}  # client id -> its starting tensors this round
        self._lag_scored: Dict[int, int] = {}   # client id -> row holding its last scored update
        # --lag_share groups: the clients' update profiles, and per round each layer's groups (-1: shared).
        self.lag_profiles: Optional[UpdateProfiles] = None
        self._lag_group_history: List[torch.Tensor] = []
        self._lag_names_of: Dict[Tuple[str, ...], Tuple[str, ...]] = {}  # parameters -> with their buffers
        clients = getattr(self, "clients", None)
        if clients and callable(getattr(clients[0], "shared_module", None)) \
                and callable(getattr(clients[0], "upload", None)):
            # What the base method shares is known before any upload: check K against it now.
            self._lag_start(clients[0], clients[0].upload())

    @property
    def lag_layers(self) -> Optional[List[Layer]]:
        return None if self.lag_selector is None else self.lag_selector.layers

    @property
    def lag_personal(self) -> Tuple[int, ...]:
        return () if self.lag_selector is None else self.lag_selector.personal

    def _lag_start(self, client, update) -> None:
        """Build the selector on the layers the base method shares, as ``client``'s ``update`` names them
        (it refuses a K that leaves none shared)."""
        candidates = self._lag_candidate_layers(client, update)
        base_method = str(self.algorithm).removesuffix("+LAG")
        self.lag_selector = LayerSelector(self.lag, candidates, base_method,
                                          self._lag_own_personal_layers(client, candidates), seed=self._lag_seed())
        if self.lag.share == "groups":
            self.lag_profiles = UpdateProfiles(len(self.clients), self.lag.group_cosine, self.lag.xi)
        self._lag_say_notes()

    def _lag_seed(self) -> int:
        """The run's seed, for the ``random`` rule's draw (0 where the server has none)."""
        return int(getattr(getattr(self, "config", None), "seed", 0) or 0)

    def _lag_say_notes(self) -> None:
        """Print, once each, what the selector wants the user to hear."""
        while self.lag_selector.notes:
            print(f"note: {self.lag_selector.notes.pop(0)}")

    # ----- broadcast: the base method's, less the personal layers -----------------------------------
    def personal_names(self) -> FrozenSet[str]:
        """The base method's own (none for most) and the personal layers', with their modules' buffers:
        the base server leaves them out of what it broadcasts, so no client ever loads them."""
        own = super().personal_names() if hasattr(super(), "personal_names") else frozenset()
        if not self.lag_personal:
            return own
        return own | self._lag_personal_tensor_names()

    def send_models(self):
        super().send_models()
        if self.lag.signal == "delta":
            # theta^(r): what each selected client starts local training from, held (a parked client's
            # tensors by reference) until its upload turns its row of the update matrix into the update.
            selected = list(self.selected_clients)
            if selected:
                self._lag_buffer(len(selected), selected[0])
            self._lag_rows = {c.id: row for row, c in enumerate(selected)}
            self._lag_starts = {c.id: model_snapshot(c) for c in selected}

    # ----- upload: base behaviour, then score and choose --------------------------------------------
    def upload_needs_gradients(self) -> bool:
        """``last_batch`` scores the last minibatch's gradients, so the uploads must carry them."""
        return self.lag.signal == "last_batch" or super().upload_needs_gradients()

    def receive_models(self):
        super().receive_models()
        uploads = list(self.uploads)
        if self.lag_selector is None and uploads:
            self._lag_start(self.clients[0], uploads[0])
        if self.lag_selector is None:
            self._lag_unscored_before += 1   # nothing uploaded yet: the round still gets its row
            return
        if not self._lag_spans:  # first round, or the layers came from a checkpoint
            self._lag_layout(self.clients[0])
            self._lag_spans = [self._lag_layer_spans(layer) for layer in self.lag_layers]
        rows = self._lag_collect_updates(uploads)
        evidence = (layer_evidence_in_spans(self._lag_matrix, self._lag_spans, self.lag.xi, rows)
                    if len(rows) >= 2 else None)
        self.lag_selector.observe(evidence, uploads=len(rows))
        if self.lag_profiles is not None:
            self._lag_regroup(rows)
        self._lag_say_notes()

    # ----- --lag_share groups: a personal layer averaged within the groups that agree on it ----------------
    def _lag_regroup(self, rows: Sequence[int]) -> None:
        """Add the round's updates (``rows`` of the update matrix, clients in ``_lag_scored``'s order) to the
        profiles of the personal layers, and record every client's group for each: (layers, clients),
        the smallest client id of the group, -1 for the shared layers."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self._lag_matrix.device) if rows else None
        updates = {} if index is None else {
            layer: torch.cat([self._lag_matrix[index, a:b] for a, b in self._lag_spans[layer]], dim=1).cpu()
            for layer in self.lag_personal}
        self.lag_profiles.observe(updates, list(self._lag_scored), self.lag_personal)
        groups = torch.full((len(self.lag_layers), self.lag_profiles.num_clients), -1, dtype=torch.int64)
        for layer in self.lag_personal:
            groups[layer] = self.lag_profiles.groups_of(layer)
        self._lag_group_history.append(groups)

    def aggregate_parameters(self):
        super().aggregate_parameters()
        if self.lag_profiles is not None and self._lag_group_history and self.uploads:
            self._lag_share_within_groups(self._lag_group_history[-1])

    @torch.no_grad()
    def _lag_share_within_groups(self, groups: torch.Tensor) -> None:
        """Every member of a group of two or more receives the group's model of each personal layer: the
        average of every member's latest copy (its parameters and its module's buffers), weighted by the
        members' training samples, members in ascending id order (so the sum does not depend on upload
        order). A member that uploaded this round contributes what it uploaded; one that did not, the copy
        it holds, which the server knows (it sent it, or received it). So a large client that sat the round
        out is not overwritten by one small uploader's copy, and with every client uploading this is the
        average of the group's uploads."""
        for layer in self.lag_personal:
            names = self._lag_with_buffers(tuple(self.lag_layers[layer].tensors))
            for members in group_members(groups[layer]).values():
                copies = [_only(model_tensors(self.clients[i]), names) for i in members]
                average = sample_weighted_average(copies, [self.clients[i].train_samples for i in members])
                for i in members:
                    write_model_tensors(self.clients[i], average)

    def _lag_collect_updates(self, uploads: Sequence) -> List[int]:
        """Turn the update matrix's rows into ``h_u`` for the uploads; returns their rows."""
        if not uploads:
            self._lag_scored = {}
            return []
        if self.lag.signal == "last_batch":
            # The authors' code: the gradient of the last minibatch of local training.
            matrix = self._lag_buffer(len(uploads), self.clients[0])
            for row, update in enumerate(uploads):
                torch.cat(self._lag_flat_parts(update, update.gradients), out=matrix[row])
            self._lag_scored = {update.client_id: row for row, update in enumerate(uploads)}
            return list(range(len(uploads)))
        self._lag_scored = {}
        rows = []
        for update in uploads:
            row = self._lag_rows.pop(update.client_id, None)
            if row is None:  # trained without a broadcast first: no starting point to compare with
                continue
            self._lag_write_update(update, self._lag_starts.pop(update.client_id), self._lag_matrix[row])
            self._lag_scored[update.client_id] = row
            rows.append(row)
        for row in self._lag_rows.values():  # selected, never uploaded: a row of zeros, never scored
            self._lag_matrix[row].zero_()
        self._lag_rows, self._lag_starts = {}, {}
        return rows

    def _lag_write_update(self, update, start: State, row: torch.Tensor) -> None:
        """``row`` := theta^(r,E) - theta^(r), one pass a tensor: each uploaded tensor less the client's
        starting one (``start``, by full name); a column the update does not hold is zero (no change)."""
        full = {update.full_name(name): tensor for name, tensor in update.tensors.items()}
        for name, (a, b) in self._lag_columns.items():
            value = full.get(name)
            if value is None:
                row[a:b].zero_()
            else:
                torch.sub(value.detach().reshape(-1), start[name].detach().reshape(-1), out=row[a:b])

    def _lag_layout(self, client) -> Dict[str, Tuple[int, int]]:
        """Column range of every parameter in the flat vector (``named_parameters()`` order)."""
        if self._lag_columns is None:
            self._lag_columns, end = {}, 0
            for name, param in client.model.named_parameters():
                self._lag_columns[name] = (end, end + param.numel())
                end += param.numel()
        return self._lag_columns

    def _lag_buffer(self, num_rows: int, client) -> torch.Tensor:
        """The (clients x parameters) matrix, reused across rounds when its size allows."""
        layout = self._lag_layout(client)
        width = max(b for _, b in layout.values())
        param = model_tensors(client)[next(iter(layout))]
        if (self._lag_matrix is None or self._lag_matrix.shape != (num_rows, width)
                or self._lag_matrix.device != param.device):
            self._lag_matrix = torch.empty(num_rows, width, dtype=param.dtype, device=param.device)
        return self._lag_matrix

    def _lag_flat_parts(self, update, tensors: State) -> List[torch.Tensor]:
        """``tensors`` (an update's gradients, by name under its ``shared_path``) in layout order, flattened;
        a column they do not hold reads as zeros."""
        full = {update.full_name(name): tensor for name, tensor in tensors.items()}
        parts = []
        for name, (a, b) in self._lag_columns.items():
            value = full.get(name)
            parts.append(value.detach().reshape(-1) if value is not None else
                         torch.zeros(b - a, dtype=self._lag_matrix.dtype, device=self._lag_matrix.device))
        return parts

    def lag_update_of(self, client_id: int) -> State:
        """The last scored update ``h_u`` of one client, by parameter name (for inspection and tests)."""
        row = self._lag_matrix[self._lag_scored[client_id]]
        return {name: row[a:b] for name, (a, b) in self._lag_columns.items()}

    # ----- naming -------------------------------------------------------------------------------------
    def lag_personal_names(self) -> List[str]:
        """Full parameter names currently kept personal."""
        return [] if self.lag_selector is None else self.lag_selector.personal_names()

    def _lag_personal_tensor_names(self) -> FrozenSet[str]:
        """Full names of the personal tensors: the chosen parameters and their modules' buffers."""
        return frozenset(self._lag_with_buffers(tuple(self.lag_personal_names())))

    def _lag_with_buffers(self, parameters: Tuple[str, ...]) -> Tuple[str, ...]:
        """``parameters`` and their modules' buffers, by full name; cached, since reading a client's model
        checks a working copy out and the structure never changes."""
        if parameters not in self._lag_names_of:
            self._lag_names_of[parameters] = tuple(with_module_buffers(self.clients[0].model, list(parameters)))
        return self._lag_names_of[parameters]

    def _lag_candidate_layers(self, client, update) -> List[Layer]:
        """Layers built from the parameters an update carries (what the base method shares), in the full
        model's order."""
        shared = {update.full_name(name) for name in update.tensors}
        ordered = [n for n, _ in client.model.named_parameters() if n in shared]
        return build_layers(ordered, self.lag.granularity)

    def _lag_own_personal_layers(self, client, candidates: Sequence[Layer]) -> List[str]:
        """The layers the base method keeps personal by design, which K counts: the trainable parameters
        of ``client.model`` it does not share (FedRep's head), and the modules a client names in
        ``personal_layer_attrs`` (FedROD's personal head, which lives beside ``model``). Normalisation
        layers are not counted (FedBN keeps them personal; they rescale features, they are not a layer
        FedLAG would choose instead of a convolution). Upstream FedRep freezes its head after the head
        epochs, so "trained" also takes the parameters a client optimiser holds."""
        shared = {name for layer in candidates for name in layer.tensors}
        trained = _trained_parameter_ids(client)
        own = [n for n, p in _feature_parameters(client.model) if id(p) in trained and n not in shared]
        for attr in getattr(client, "personal_layer_attrs", ()):
            own += [f"{attr}.{n}" for n, _ in _feature_parameters(getattr(client, attr))]
        return [layer.name for layer in build_layers(own, self.lag.granularity)]

    def _lag_layer_spans(self, layer: Layer) -> List[Tuple[int, int]]:
        """Column ranges of a layer's tensors, adjacent ones merged (a module's weight and bias)."""
        spans: List[Tuple[int, int]] = []
        for name in layer.tensors:
            a, b = self._lag_columns[name]
            if spans and spans[-1][1] == a:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
        return spans

    # ----- state (checkpoints) -----------------------------------------------------------------------
    def lag_state(self) -> dict:
        state = {"selector": None if self.lag_selector is None else self.lag_selector.state_dict(),
                 "unscored_before": self._lag_unscored_before}
        if self.lag.share == "groups":
            state["groups"] = {"profiles": None if self.lag_profiles is None else self.lag_profiles.state_dict(),
                               "history": list(self._lag_group_history)}
        return state

    def load_lag_state(self, state: dict) -> None:
        selector = state["selector"]
        self.lag_selector = None if selector is None else LayerSelector.from_state_dict(self.lag, selector)
        self._lag_unscored_before = int(state["unscored_before"])
        groups = state.get("groups")
        if self.lag.share == "groups" and groups is not None and groups["profiles"] is not None:
            self.lag_profiles = UpdateProfiles(len(self.clients), self.lag.group_cosine, self.lag.xi)
            self.lag_profiles.load_state_dict(groups["profiles"])
            self._lag_group_history = [g.clone() for g in groups["history"]]
        self._lag_columns, self._lag_spans = None, []  # rebuilt from the layers at the next upload

    def get_state(self):
        state = super().get_state() if hasattr(super(), "get_state") else {}
        state["lag"] = self.lag_state()
        return state

    def set_state(self, state):
        state = dict(state)
        self.load_lag_state(state.pop("lag"))
        if hasattr(super(), "set_state"):
            super().set_state(state)

    # ----- results --------------------------------------------------------------------------------------
    def lag_results(self) -> Dict[str, object]:
        """The ``lag_*`` arrays for the run's .h5, one row per round (see ``LayerSelector.result_arrays``)."""
        if self.lag_selector is None:
            empty = torch.zeros((self._lag_unscored_before, 0))
            return {"lag_layer_names": [], "lag_conflict_scores": empty.long(), "lag_pairs": empty.long(),
                    "lag_mean_cosines": empty.double(), "lag_personal": empty.bool(),
                    "lag_num_uploads": torch.zeros(self._lag_unscored_before, dtype=torch.int64),
                    "lag_scored": torch.zeros(self._lag_unscored_before, dtype=torch.bool)}
        arrays = self.lag_selector.result_arrays(unscored_before=self._lag_unscored_before)
        if self.lag_profiles is not None:
            # lag_groups[r, l, c]: client c's group for layer l after round r (its smallest client id), -1
            # where layer l was shared.
            width, clients = len(self.lag_layers), self.lag_profiles.num_clients
            rows = [torch.full((width, clients), -1, dtype=torch.int64)] * self._lag_unscored_before
            rows += self._lag_group_history
            arrays["lag_groups"] = torch.stack(rows) if rows else torch.zeros((0, width, clients), dtype=torch.int64)
        return arrays

    def result_arrays(self):
        arrays = super().result_arrays() if hasattr(super(), "result_arrays") else {}
        arrays.update(self.lag_results())
        return arrays

    def result_attrs(self):
        attrs = super().result_attrs() if hasattr(super(), "result_attrs") else {}
        attrs["lag"] = asdict(self.lag)
        return attrs


def _only(tensors: State, names: Sequence[str]) -> State:
    return {name: tensors[name] for name in names}


_NORMALISATION = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _trained_parameter_ids(client) -> set:
    """Parameters the client trains: those that take gradients now, and those any of its optimisers
    hold (a method may freeze a part between phases of local training)."""
    ids = {id(p) for p in client.model.parameters() if p.requires_grad}
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


def with_layer_conflict(server_class: type, name: Optional[str] = None) -> type:
    """``X+LAG``: a subclass of ``server_class`` with :class:`LayerConflictMixin` first in its MRO."""
    if issubclass(server_class, LayerConflictMixin):
        raise LagError(f"{server_class.__name__} already personalises conflicting layers")
    class_name = (name or f"{server_class.__name__}+LAG").replace("+", "_")
    return type(class_name, (LayerConflictMixin, server_class), {"__doc__": server_class.__doc__})
