"""Dataclass fields that declare their command-line flag: its names, help, default and allowed values.

A frozen dataclass whose fields are made with :func:`flag` is the whole definition of those flags.
Generic readers turn it into argparse arguments (:func:`add_arguments`), read it back from a parsed
namespace (:func:`read_namespace`), record it as ``{dest: value}`` (:func:`flag_values`) and list the
values it refuses, each message naming the flag (:func:`field_problems`), e.g.
``-jr/--join_ratio must be in (0, 1], got 1.5``. A field made with :func:`nested` holds another such
dataclass, whose flags follow in place.

The project's ``RunConfig`` (``app/config.py``), every algorithm's hyper-parameters (``flcore/``) and
FedLAG's ``LagSettings`` (``flcore/lag/settings.py``) are declared this way.
Why here: ``utils/`` is the lowest layer that both ``app/`` and ``flcore/`` may import (docs/architecture.md).
Standard library only: the PFLlib patch installs it as the checkout's ``system/utils/flagfields.py``, where
the copied ``lag/settings.py`` imports it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

FLAG = "flag"      # field metadata: the FlagSpec
NESTED = "nested"  # field metadata: the dataclass whose flags the field holds
_FIELD_DEFAULT = object()


def str2bool(value: str) -> bool:
    """PFLlib's booleans, meaning what they say (PFLlib's ``type=bool`` turns ``False`` into True)."""
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False, 1/0, yes/no), got {value!r}")


@dataclass(frozen=True)
class FlagSpec:
    """How one field appears on the command line, and which values it takes."""
    names: Tuple[str, ...]                 # option strings, short first: ("-mu", "--mu")
    help: Union[str, Callable[[], str]] = ""  # a function for text computed only when --help is built
    type: Optional[Callable] = None        # argparse's type; by default the default's int or float
    choices: Optional[Tuple] = None
    minimum: Optional[float] = None        # value >= minimum
    above: Optional[float] = None          # value > above
    maximum: Optional[float] = None        # value <= maximum
    below: Optional[float] = None          # value < below
    meaning: str = ""     # what the value is, for refusals of a flag several algorithms read differently
    hint: str = ""        # added to a refusal: what to try instead
    switch: bool = False  # a bare flag (store_true), not a value
    command_line_default: object = _FIELD_DEFAULT  # when it differs from the field's (None: "resolved later")
    run_key: str = ""     # its key in the Flower app's run config, where the app exposes it

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under: the long name without its dashes."""
        return next(n for n in self.names if n.startswith("--"))[2:]

    @property
    def label(self) -> str:
        return "/".join(self.names)

    def bounds(self) -> str:
        """``>= 0``, ``in (0, 1]`` ...; "" when unbounded."""
        low = ("[", self.minimum) if self.minimum is not None else None
        low = ("(", self.above) if self.above is not None else low
        high = ("]", self.maximum) if self.maximum is not None else None
        high = (")", self.below) if self.below is not None else high
        if low and high:
            return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
        return ""

    def within(self, value) -> bool:
        return ((self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
                and (self.maximum is None or value <= self.maximum) and (self.below is None or value < self.below))

    def problem(self, value) -> Optional[str]:
        """Why ``value`` is refused, naming the flag; None when it is accepted (None always is: "unset")."""
        if value is None:
            return None
        who = f"{self.label} ({self.meaning})" if self.meaning else self.label
        if self.choices is not None and value not in self.choices:
            return f"{who} must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if not isinstance(value, bool) and isinstance(value, (int, float)) and not self.within(value):
            return f"{who} must be {self.bounds()}, got {value}" + (f"; {self.hint}" if self.hint else "")  # NaN too
        if isinstance(value, float) and not math.isfinite(value):
            # A NaN would surface much later as a diverged loss blamed on another flag.
            return f"{who} must be a finite number, got {value}"
        return None


def flag(*names: str, default, help: Union[str, Callable[[], str]] = "", **rules) -> dataclasses.Field:
    """A dataclass field declaring its flag; ``rules`` are :class:`FlagSpec`'s other fields."""
    return dataclasses.field(default=default, metadata={FLAG: FlagSpec(tuple(names), help, **rules)})


def nested(cls: type) -> dataclasses.Field:
    """A field holding a ``cls`` (itself made of flag fields) whose flags are listed in its place."""
    return dataclasses.field(default_factory=cls, metadata={NESTED: cls})


def flag_fields(cls) -> Iterator[Tuple[dataclasses.Field, FlagSpec]]:
    """Every (field, spec) of ``cls`` (a class or an instance) and of the dataclasses it nests, in order."""
    for f in dataclasses.fields(cls):
        if NESTED in f.metadata:
            yield from flag_fields(f.metadata[NESTED])
        elif FLAG in f.metadata:
            yield f, f.metadata[FLAG]


def add_arguments(parser, cls) -> None:
    """Add ``cls``'s flags to an argparse parser or group; flags the parser already has are left alone."""
    existing = getattr(parser, "_option_string_actions", {})
    for f, spec in flag_fields(cls):
        if any(name in existing for name in spec.names):
            continue
        default = f.default if spec.command_line_default is _FIELD_DEFAULT else spec.command_line_default
        keywords = dict(default=default, help=spec.help() if callable(spec.help) else spec.help)
        if spec.switch:
            keywords["action"] = "store_true"
        elif isinstance(f.default, bool):
            keywords.update(type=str2bool, nargs="?", const=True)  # "-ab" alone means true
        elif spec.type is not None or isinstance(f.default, (int, float)):
            keywords["type"] = spec.type or type(f.default)
        if spec.choices is not None:
            keywords["choices"] = spec.choices
        parser.add_argument(*spec.names, **keywords)


def read_namespace(cls, namespace) -> Dict[str, object]:
    """Field name -> value of ``cls``'s own flags in a parsed namespace (a flag it lacks: the field default)."""
    return {f.name: getattr(namespace, f.metadata[FLAG].dest, f.default)
            for f in dataclasses.fields(cls) if FLAG in f.metadata}


def flag_values(obj) -> Dict[str, object]:
    """``{dest: value}`` of every flag of ``obj`` and of what it nests, in declaration order: the record
    of a run's flags (the same keys as argparse's namespace)."""
    values: Dict[str, object] = {}
    for f in dataclasses.fields(obj):
        if NESTED in f.metadata:
            values.update(flag_values(getattr(obj, f.name)))
        elif FLAG in f.metadata:
            values[f.metadata[FLAG].dest] = getattr(obj, f.name)
    return values


def field_problems(obj) -> List[str]:
    """The values of ``obj``'s own flag fields that their declarations refuse (nested ones aside)."""
    found = (f.metadata[FLAG].problem(getattr(obj, f.name)) for f in dataclasses.fields(obj) if FLAG in f.metadata)
    return [problem for problem in found if problem]
