"""How a model refuses a name or an input it cannot take (a user error: one line, no traceback).

Each model that needs a minimum input size checks it when built, so the refusal names the model and
the reason before any data is read, instead of a shape error deep inside a forward pass.
"""
from __future__ import annotations

from typing import Sequence

from utils.errors import UserError


class UnknownModelError(UserError, ValueError):
    pass


def require_min_input(model: str, shape: Sequence[int], minimum: Sequence[int], reason: str) -> None:
    """Refuse ``shape`` if any dimension is below ``minimum`` (same length: one bound per dimension)."""
    shape, minimum = tuple(shape), tuple(minimum)
    if len(shape) == len(minimum) and all(s >= m for s, m in zip(shape, minimum)):
        return
    raise UnknownModelError(f"model {model} needs inputs of at least {_dims(minimum)}, got {_dims(shape)} "
                            f"({reason}); choose another -m")


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(v) for v in shape)
