"""The round's client updates as rows of one (clients x parameters) matrix, and the views FedLAG reads.

Every parameter of the model has a column range in a flat vector (``named_parameters()`` order); a layer is
the list of its tensors' ranges, adjacent ones merged (a module's weight and bias). With ``--lag_signal
delta`` each selected client gets a row when it is sent its model, and the tensors it starts from are held
(a parked client's by reference: nobody writes them, training and a delivery replace them); at upload the
row becomes ``theta^(r,E) - theta^(r)`` in place. With ``last_batch`` the rows are the uploads' last
minibatch gradients. Every layer is then scored on a column view of the matrix: no per-layer or per-client
copies (100 clients x 1M parameters cost one 400 MB buffer and one m x m Gram matrix per layer).

Reads clients only (:mod:`.client_tensors`); imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .client_tensors import model_of, model_snapshot, model_tensors
from .conflict import Layer, LayerEvidence, layer_evidence_in_spans

State = Dict[str, torch.Tensor]
Span = Tuple[int, int]


class UpdateMatrix:
    """The update matrix, its column layout and which client holds which row."""

    def __init__(self):
        # Rebuilt from the first client seen after a start or a checkpoint: the layout, the layers' spans.
        self.columns: Optional[Dict[str, Span]] = None
        self.spans: List[List[Span]] = []
        self.matrix: Optional[torch.Tensor] = None
        self.rows: Dict[int, int] = {}     # client id -> its row this round (delta: set when it is sent its model)
        self.starts: Dict[int, State] = {}  # client id -> the tensors it starts local training from
        self.scored: Dict[int, int] = {}   # client id -> the row holding its last scored update

    # ----- layout -------------------------------------------------------------------------------------------
    def layout(self, client) -> Dict[str, Span]:
        """Column range of every parameter in the flat vector (``client.model``'s ``named_parameters()``)."""
        if self.columns is None:
            self.columns, end = {}, 0
            for name, param in model_of(client).named_parameters():
                self.columns[name] = (end, end + param.numel())
                end += param.numel()
        return self.columns

    def forget_layout(self) -> None:
        """Drop the layout and spans (the layers came from a checkpoint): rebuilt at the next upload."""
        self.columns, self.spans = None, []

    def layer_spans(self, layer: Layer) -> List[Span]:
        """Column ranges of a layer's tensors, adjacent ones merged (a module's weight and bias)."""
        spans: List[Span] = []
        for name in layer.tensors:
            a, b = self.columns[name]
            if spans and spans[-1][1] == a:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
        return spans

    def use_layers(self, client, layers: Sequence[Layer]) -> None:
        """Lay the columns out from ``client`` and find the spans of ``layers``, unless done already."""
        if not self.spans:
            self.layout(client)
            self.spans = [self.layer_spans(layer) for layer in layers]

    def buffer(self, num_rows: int, client) -> torch.Tensor:
        """The (clients x parameters) matrix, reused across rounds when its size allows."""
        layout = self.layout(client)
        width = max(b for _, b in layout.values())
        param = model_tensors(client)[next(iter(layout))]
        if (self.matrix is None or self.matrix.shape != (num_rows, width)
                or self.matrix.device != param.device):
            self.matrix = torch.empty(num_rows, width, dtype=param.dtype, device=param.device)
        return self.matrix

    # ----- one round ----------------------------------------------------------------------------------------
    def start(self, selected: Sequence) -> None:
        """``delta``: each selected client's row, and the tensors it starts the round from, held until its
        upload turns the row into its update."""
        if selected:
            self.buffer(len(selected), selected[0])
        self.rows = {c.id: row for row, c in enumerate(selected)}
        self.starts = {c.id: model_snapshot(c) for c in selected}

    def collect(self, uploads: Sequence, signal: str, client) -> List[int]:
        """Turn rows of the matrix into the uploads' ``h_u`` (``client``: any client, for the layout);
        returns their rows, in upload order."""
        if not uploads:
            self.scored = {}
            return []
        if signal == "last_batch":
            # The authors' code: the gradient of the last minibatch of local training.
            matrix = self.buffer(len(uploads), client)
            for row, update in enumerate(uploads):
                torch.cat(self._flat_parts(update, update.gradients), out=matrix[row])
            self.scored = {update.client_id: row for row, update in enumerate(uploads)}
            return list(range(len(uploads)))
        self.scored = {}
        rows = []
        for update in uploads:
            row = self.rows.pop(update.client_id, None)
            if row is None:  # trained without being sent a model first: no starting point to compare with
                continue
            self._write_update(update, self.starts.pop(update.client_id), self.matrix[row])
            self.scored[update.client_id] = row
            rows.append(row)
        for row in self.rows.values():  # selected, never uploaded: a row of zeros, never scored
            self.matrix[row].zero_()
        self.rows, self.starts = {}, {}
        return rows

    def _write_update(self, update, start: State, row: torch.Tensor) -> None:
        """``row`` := theta^(r,E) - theta^(r), one pass a tensor: each uploaded tensor less the client's
        starting one (``start``, by full name); a column the update does not hold is zero (no change)."""
        full = {update.full_name(name): tensor for name, tensor in update.tensors.items()}
        for name, (a, b) in self.columns.items():
            value = full.get(name)
            if value is None:
                row[a:b].zero_()
            else:
                torch.sub(value.detach().reshape(-1), start[name].detach().reshape(-1), out=row[a:b])

    def _flat_parts(self, update, tensors: State) -> List[torch.Tensor]:
        """``tensors`` (an update's gradients, by name under its ``shared_path``) in layout order, flattened;
        a column they do not hold reads as zeros."""
        full = {update.full_name(name): tensor for name, tensor in tensors.items()}
        parts = []
        for name, (a, b) in self.columns.items():
            value = full.get(name)
            parts.append(value.detach().reshape(-1) if value is not None else
                         torch.zeros(b - a, dtype=self.matrix.dtype, device=self.matrix.device))
        return parts

    # ----- what is read from it -----------------------------------------------------------------------------
    def evidence(self, rows: Sequence[int], xi: float) -> Optional[LayerEvidence]:
        """Every layer's conflict evidence over ``rows``; None with fewer than two (no pair to score)."""
        return layer_evidence_in_spans(self.matrix, self.spans, xi, rows) if len(rows) >= 2 else None

    def layer_updates(self, layers: Sequence[int], rows: Sequence[int]) -> Dict[int, torch.Tensor]:
        """``{layer index: (len(rows), layer size)}``: the updates of ``layers`` in ``rows``, on the CPU."""
        if not rows:
            return {}
        index = self._row_index(rows)
        return {layer: self._layer_columns(layer, index).cpu() for layer in layers}

    def sketch_layers(self, layers: Sequence[int], rows: Sequence[int],
                      sketch_of: Callable[[int, torch.Tensor], torch.Tensor]) -> None:
        """Replace ``layers``' updates in ``rows`` by ``sketch_of(layer, updates)`` ((len(rows), k), k at most the
        layer's size): written into each layer's first k columns, zeros after them, so every score of the
        layer (its Gram matrix) is the sketches'. The updates themselves are no longer held."""
        if not rows:
            return
        index = self._row_index(rows)
        for layer in layers:
            updates = self._layer_columns(layer, index)
            flat = torch.zeros_like(updates)
            sketches = sketch_of(layer, updates)
            flat[:, :sketches.shape[1]] = sketches
            offset = 0
            for a, b in self.spans[layer]:
                self.matrix[index, a:b] = flat[:, offset:offset + b - a]
                offset += b - a

    def _row_index(self, rows: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(rows), dtype=torch.long, device=self.matrix.device)

    def _layer_columns(self, layer: int, index: torch.Tensor) -> torch.Tensor:
        """The (len(index), layer size) updates of ``layer`` in the rows ``index``: a copy, its spans joined."""
        return torch.cat([self.matrix[index, a:b] for a, b in self.spans[layer]], dim=1)

    def update_of(self, client_id: int) -> State:
        """The last scored update ``h_u`` of one client, by parameter name (views of its row)."""
        row = self.matrix[self.scored[client_id]]
        return {name: row[a:b] for name, (a, b) in self.columns.items()}
