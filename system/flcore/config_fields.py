"""PFLlib's attribute names for a run's flags, read from the one place they live: the run's config.

Code written against PFLlib reads ``self.global_rounds`` on a server and ``self.batch_size`` on a
client. Here those attributes are views of ``self.config`` (the run's frozen, typed flags), declared
once per name with :class:`ConfigField`, so there is one source of each value and no copy that could
drift from it; assigning one is refused with the reason.
"""
from __future__ import annotations

from typing import Optional


class ConfigField:
    """``owner.<name>`` is ``owner.config.<field>`` (``field`` defaults to the attribute's own name)."""

    def __init__(self, field: Optional[str] = None):
        self.field = field
        self.name = field or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.field = self.field or name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj.config, self.field)

    def __set__(self, obj, value) -> None:
        raise AttributeError(f"{self.name} is the run's config.{self.field} (a flag); it cannot be set on "
                             f"{type(obj).__name__}")
