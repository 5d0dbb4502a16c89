"""The one base of every error that is the user's to fix, and the two that any layer raises.

``main.py`` prints such an error as one line (``error: <message>``) and exits with status 2; anything
else is a bug and keeps its traceback. Each subclass also has a built-in base
(``ValueError`` or ``RuntimeError``), so callers that caught those still do. ``flcore/lag/`` is the one
exception: it imports only torch so that it drops into a PFLlib checkout, and ``main.py`` names its
``LagError`` beside this class.
"""


class UserError(Exception):
    """A problem with what was asked (flags, data, files, devices); the message says what to change."""


class ConfigError(UserError, ValueError):
    """Flags that do not fit together, or do not fit the chosen algorithm; the message says which."""


class RunError(UserError, RuntimeError):
    """A run stopped for a reason the user can act on; the message says what to change."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its class name when it has none: a reason that fits in a line."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
