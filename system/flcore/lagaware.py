"""What ``X+LAG`` currently keeps personal, as seen from X's own server code.

Most methods need not ask: :class:`~flcore.lag.mixin.LayerConflictMixin` puts the personal layers
back after X's broadcast. Three of ours ask anyway, because their broadcast is more than a copy:
FedAMP's broadcast is a proximal anchor that never enters ``client.model`` (so a personal layer must
be left out of the pull, not restored), FedALA learns its mixing weights on the received model
before the mixin could restore anything (so a personal layer must stay in place while it learns),
and FedAS trains an aligned copy of the received body (whose personal positions must hold the
client's own values, not the average).
"""
from __future__ import annotations

from typing import FrozenSet


def lag_personal_names(server) -> FrozenSet[str]:
    """Full parameter names ``X+LAG`` keeps personal now; empty for X alone."""
    names = getattr(server, "lag_personal_names", None)
    return frozenset(names()) if callable(names) else frozenset()
