"""FedLAG's knobs, :class:`LagSettings`: the one definition of the ``--lag_*`` flags.

Each field declares its flag (:mod:`utils.flagfields`): this project's command line, its Flower run config
(``lag-top-k`` ...) and the flags the PFLlib patch adds to an upstream main.py are all made from it, and
:meth:`LagSettings.check` is the one place their values are refused. Imports only the standard library,
``utils/flagfields.py`` (which the PFLlib patch installs beside upstream's ``utils/``) and ``conflict.py``,
so ``lag/`` can be copied into a PFLlib checkout unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Optional

from utils.flagfields import add_arguments, field_problems, flag, read_namespace

from .conflict import GRANULARITIES

SCHEDULES = ("smoothed", "every_round", "warmup", "random")
SHARES = ("own", "groups", "check")
CHECK_DATA = ("held_out", "train")
SIGNALS = ("delta", "last_batch")
UPLOADS = ("all", "sketch")
# The flags (by dest) that only one schedule reads; every other --lag_* flag applies to all three.
SCHEDULE_ONLY_FLAGS = {"smoothed": ("lag_decay", "lag_margin"), "every_round": (), "warmup": ("lag_warmup",)}


class LagError(ValueError):
    """FedLAG cannot be applied as configured; the message says why."""


def unused_by_schedule(schedule: str) -> FrozenSet[str]:
    """The ``--lag_*`` flags (by dest) that ``schedule`` does not read: those of the other schedules.
    None for a schedule this version does not know (any flag may matter to it)."""
    if schedule not in SCHEDULE_ONLY_FLAGS:
        return frozenset()
    return frozenset(dest for other, dests in SCHEDULE_ONLY_FLAGS.items() if other != schedule for dest in dests)


def default_warmup(global_rounds: int) -> int:
    """The authors' warm-up length, min(floor(R / 2), 30), at least one round."""
    return max(1, min(int(global_rounds) // 2, 30))


@dataclass(frozen=True)
class LagSettings:
    """FedLAG's knobs, each with its ``--lag_*`` flag."""
    top_k: int = flag("--lag_top_k", default=1, minimum=0, run_key="lag-top-k", help=(
        "personal layers K in total, the base method's own included (FedRep's head counts; 0 = the base "
        "method exactly)"))
    xi: float = flag("--lag_xi", default=0.0, minimum=-1, maximum=0, run_key="lag-xi",
                     help="cosine threshold xi in [-1, 0]; a pair conflicts when cos < xi")
    schedule: str = flag("--lag_schedule", default="smoothed", choices=SCHEDULES, run_key="lag-schedule", help=(
        "smoothed: decayed mean cosine, a personal layer replaced only on evidence; every_round: the paper's "
        "rule (each round's top-K); "
        "warmup: the authors' code (sum W rounds, then freeze); random: K layers drawn once per run (a control)"))
    # Left out on the command line it depends on -gr: from_args fills in min(gr // 2, 30).
    warmup: int = flag("--lag_warmup", default=30, type=int, minimum=0, command_line_default=None, run_key="lag-warmup",
                       help="warm-up rounds W of the warmup schedule (default: min(gr // 2, 30))")
    granularity: str = flag("--lag_granularity", default="module", choices=GRANULARITIES, run_key="lag-granularity",
                            help="a layer is a module (weight and bias together) or a single parameter tensor")
    signal: str = flag("--lag_signal", default="delta", choices=SIGNALS, help=(
        "update scored: parameters after minus before local training, or the last batch's gradient"))
    decay: float = flag("--lag_decay", default=0.9, above=0, maximum=1, run_key="lag-decay", help=(
        "smoothed: weight kept by the evidence so far at each scored round, in (0, 1]"))
    margin: float = flag("--lag_margin", default=2.0, minimum=0, run_key="lag-margin", help=(
        "smoothed: standard errors by which a layer's cosines must lie below a personal layer's, pair for "
        "pair, to displace it, or below those of the layers nearer the output, to take a free place before them"))

    share: str = flag("--lag_share", default="own", choices=SHARES, run_key="lag-share", help=(
        "own: every client keeps its own copy of a personal layer; groups: a personal layer is averaged "
        "within each group of clients whose updates of it agree (--lag_group_cosine); check: each client "
        "takes, of its own copy, its group's and everyone's, the one of lowest loss on its check data "
        "(--lag_check_data)"))
    check_data: str = flag("--lag_check_data", default="held_out", choices=CHECK_DATA, run_key="lag-check-data",
                           help=("check: the data a client compares copies on: held_out (its --val_ratio "
                                 "split, never trained on) or train (its training data)"))
    group_cosine: float = flag("--lag_group_cosine", default=0.1, minimum=-1, maximum=1,
                               run_key="lag-group-cosine", help=("groups: two groups of clients merge while the mean cosine of their "
                                     "updates of the layer, over the pairs seen, is above this"))
    upload: str = flag("--lag_upload", default="all", choices=UPLOADS, run_key="lag-upload", help=(
        "all: clients upload their personal layers too (the server scores them, never sends them back); "
        "sketch: they keep them and upload a count sketch of each one's update (--lag_sketch_dim numbers), "
        "which the server scores instead"))
    sketch_dim: int = flag("--lag_sketch_dim", default=64, type=int, minimum=1, run_key="lag-sketch-dim", help=(
        "sketch: numbers uploaded per personal layer (at most a quarter of the layer's values)"))

    @classmethod
    def from_args(cls, args) -> "LagSettings":
        """From parsed ``--lag_*`` flags (this project's or an upstream PFLlib main.py's), with the warm-up
        length that depends on ``-gr`` filled in; not checked (see :meth:`check`)."""
        values = read_namespace(cls, args)
        if getattr(args, "lag_warmup", None) is None:
            values["warmup"] = default_warmup(getattr(args, "global_rounds", 60))
        return cls(**values)

    def problems(self, global_rounds: Optional[int] = None) -> List[str]:
        """The values FedLAG cannot run with, each naming its flag; ``global_rounds``: the run's -gr."""
        problems = field_problems(self)
        if self.schedule == "warmup" and self.warmup >= 0:
            if self.warmup < 1:
                problems.append(f"--lag_warmup must be >= 1 with --lag_schedule warmup, got {self.warmup}")
            elif global_rounds is not None and self.warmup > global_rounds:
                problems.append(f"--lag_warmup {self.warmup} is longer than the run (-gr {global_rounds} trains "
                                f"rounds 0..{global_rounds}, so no round would be personalised); "
                                f"use --lag_warmup <= {global_rounds}")
        if self.upload == "sketch" and self.share != "own":
            problems.append(f"--lag_upload sketch keeps the personal layers on the clients, and --lag_share "
                            f"{self.share} averages them on the server: use one or the other")
        return problems

    def check(self, global_rounds: Optional[int] = None) -> None:
        """Raise :class:`LagError` listing every value of :meth:`problems`."""
        problems = self.problems(global_rounds)
        if problems:
            raise LagError("; ".join(problems))


def add_lag_arguments(parser) -> None:
    """Add the ``--lag_*`` flags to an argparse parser or group (those it already has are left alone)."""
    add_arguments(parser, LagSettings)
