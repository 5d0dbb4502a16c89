"""What a dataset's inputs are (images, token ids or feature vectors), checked against its config and its files.

The kinds and their on-disk form are defined in ``dataset/utils/client_files.py``. Each check here
returns the problem as text (None when there is none); :mod:`utils.client_data` and
:mod:`utils.datasets` turn it into a ``DatasetError`` with the command that rebuilds the folder.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from dataset.utils.client_files import IMAGE_INPUTS, INPUT_KINDS, TOKEN_INPUTS, VECTOR_INPUTS, input_kind

# The shape of one input, per kind: its rank, and how messages spell it.
SAMPLE_RANK = {IMAGE_INPUTS: 3, TOKEN_INPUTS: 1, VECTOR_INPUTS: 1}
SAMPLE_FORM = {IMAGE_INPUTS: "(C, H, W)", TOKEN_INPUTS: "(L,)", VECTOR_INPUTS: "(D,)"}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def config_inputs(config: Mapping, shape: Sequence[int]) -> Tuple[str, Optional[int], Optional[str]]:
    """``(kind, vocab_size, problem)`` of a config whose samples have ``shape``.

    Token datasets must record a ``vocab_size`` of at least 2 (padding and one token) and, where they
    record ``max_len``, the length their ``input_shape`` says."""
    kind = input_kind(config)
    if kind not in INPUT_KINDS:
        return kind, None, f"input_kind is {kind!r}, expected one of {', '.join(INPUT_KINDS)}"
    if len(shape) != SAMPLE_RANK[kind]:
        hint = (f" (token ids of shape (L,) need input_kind {TOKEN_INPUTS!r} and a vocab_size)"
                if kind == IMAGE_INPUTS else "")
        return kind, None, (f"inputs of kind {kind} must have shape {SAMPLE_FORM[kind]}, but input_shape is "
                            f"{list(shape)}{hint}")
    if kind != TOKEN_INPUTS:
        return kind, None, None
    vocab_size = config.get("vocab_size")
    if not _whole(vocab_size) or vocab_size < 2:
        return kind, None, f"vocab_size is {vocab_size!r}, expected a whole number >= 2 for token inputs"
    max_len = config.get("max_len", shape[0])
    if max_len != shape[0]:
        return kind, None, f"max_len {max_len!r} differs from the sequence length {shape[0]} of input_shape"
    return kind, vocab_size, None


def file_inputs_problem(x: np.ndarray, kind: str, shape: Sequence[int], vocab_size: Optional[int]) -> Optional[str]:
    """What is wrong with a client file's ``x`` for inputs of ``kind`` and sample ``shape``."""
    if kind == TOKEN_INPUTS:
        if x.dtype.kind not in "iu":
            return f"inputs x have dtype {x.dtype}; token ids must be integers"
    elif x.dtype.kind not in "fiu":
        return f"inputs x have dtype {x.dtype}; they must be real numbers"
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
        return f"x has shape {x.shape}, expected (N, {', '.join(map(str, shape))})"
    if kind == TOKEN_INPUTS and x.size:
        low, high = int(x.min()), int(x.max())
        if low < 0:
            return f"token id {low} is negative; ids start at 0 (padding)"
        if high >= vocab_size:
            return f"token id {high} is not below the vocab_size {vocab_size} config.json records"
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        return f"x holds {int(x.size - np.isfinite(x).sum())} NaN or infinite values"
    return None


def inputs_tensor(x: np.ndarray, kind: str, channels_last: bool = False) -> torch.Tensor:
    """A checked ``x`` as the models take it: float32 images (optionally channels-last), int64 ids."""
    if kind == TOKEN_INPUTS:
        return torch.as_tensor(np.ascontiguousarray(x, dtype=np.int64))
    x_t = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    if channels_last:
        x_t = x_t.contiguous(memory_format=torch.channels_last)
    return x_t
