"""The command line: PFLlib's flag names, short forms and defaults, plus the project's own.

The flags are declared once, as the fields of :class:`~app.config.RunConfig` (and of the
hyper-parameter and FedLAG groups it holds); this module makes the argparse parser from them, parses,
and checks the combinations that parse but make a run pointless.

Differences from PFLlib, on purpose:
* boolean flags accept ``True/False/1/0/yes/no`` (PFLlib's ``type=bool`` turns ``False`` into True),
  and may be given bare (``-ab``) to mean true;
* ``-data`` defaults to ``Digits``, the embedded dataset, so the first command needs no download;
* ``-ncl`` defaults to the dataset's own class count (config.json), not 10, and ``-vs`` to a text
  dataset's vocabulary size, not 80;
* ``--seed`` seeds everything; run ``i`` of ``-t`` uses ``seed + i``;
* a shared hyper-parameter flag left out (``-mu``, ``-bt`` ...) takes the chosen algorithm's own default,
  its paper's value, where PFLlib's would refuse or switch the method off (``--help`` lists them);
* ``--threads`` left out means one intra-op thread unless OMP_NUM_THREADS is exported (``app.threads``).
"""
from __future__ import annotations

import argparse
import functools
import math
import re
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

from app.config import RunConfig
from dataset.utils.one_line import OneLineParser
from flcore.algorithm_flags import AlgorithmFlags
from flcore.flag_use import unused_flags, unused_reason
from flcore.registry import lag_base, own_defaults_by_flag, uploads_parameters
from flcore.trainmodel.models import IMAGE_MODELS, MODELS, TEXT_MODELS, UnknownModelError
from utils.flagfields import add_arguments, flag_fields, flag_values
from utils.names import unknown_name_message
from utils.rounds import rounds_run


# What ``python system/main.py`` runs with no flag at all: the README's quickstart (FedLAG where it shows what it
# is for, about 20 s on a free 2-core CPU). PFLlib's defaults (FedAvg, -gr 2000: 2,001 rounds) would run for
# many minutes on a split where each client alone does best. Any flag given keeps every other flag's
# PFLlib default, so scripts mean what they meant.
QUICKSTART = ("-algo", "FedLAG", "-data", "Digits-iid-lg4", "-nc", "40", "-lr", "0.05", "-gr", "100")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds ``(default: X)`` to every help line, except where the default is None or empty: those flags
    say in their own words what happens when they are left out (e.g. "the dataset's class count")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default == "":
            return action.help or ""
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> List[str]:
        # Never break inside a name such as LG-FedAvg or a value such as bit-identical.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser(parser_class: type = OneLineParser) -> argparse.ArgumentParser:
    """The command line, made from :class:`~app.config.RunConfig`'s field declarations."""
    parser = parser_class(
        description="Personalised federated learning benchmark (PFLlib-compatible command line).",
        formatter_class=HelpFormatter, help_command="python system/main.py --help")
    add_arguments(parser, RunConfig)
    # A word such as -5G or -1e-3 after a flag is its value, as Python 3.13's argparse reads it: before 3.13
    # only -5 and -0.5 were, and "--state_memory -5G" said "expected one argument" instead of what is wrong
    # with -5G. No flag of main.py starts with a dash and a digit, so no flag is lost.
    parser._negative_number_matcher = re.compile(r"^-\.?[0-9]")
    shared = {spec.dest: f.default for f, spec in flag_fields(AlgorithmFlags)}
    for action in parser._actions:
        if action.dest in shared:  # left out, they read None: the chosen algorithm's default is filled in later
            action.help = f"{action.help} ({shared_flag_default(action.dest, shared[action.dest])})"
    return parser


class ReadingParser(OneLineParser):
    """main.py's parser used to read flags, not to run: what would make main.py stop (a bad value, or
    ``-h``) raises ``ValueError`` with argparse's message, and nothing is printed."""

    def error(self, message: str):
        raise ValueError(message)

    def exit(self, status: int = 0, message: Optional[str] = None):
        raise ValueError(message or "-h/--help prints main.py's help instead of running it")

    def print_help(self, file=None) -> None:
        pass


def flags_given(argv: Sequence[str]) -> Dict[str, str]:
    """``{dest: its flag names, e.g. '-go/--goal'}`` of the flags ``argv`` sets, read exactly as main.py
    reads them (abbreviations, ``--flag=value``, a short flag's attached value); words main.py does not know
    are left for it to refuse. Raises ``ValueError`` with argparse's message where main.py would stop."""
    parser = build_parser(ReadingParser)
    unset = object()
    names = {action.dest: "/".join(action.option_strings) for action in parser._actions}
    namespace = argparse.Namespace(**{dest: unset for dest in flag_defaults()})
    parser.parse_known_args(list(argv), namespace)
    return {dest: names[dest] for dest, value in vars(namespace).items() if value is not unset}


def flag_pieces(argv: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``argv`` (a command main.py has read) cut into ``(dest, words)``: each flag with the value it took, as
    argparse reads it (``--flag value``, ``--flag=value``, ``-t3``, a unique abbreviation, a bare boolean);
    a word that is no flag comes alone, with dest "". Joined again, the pieces are ``argv``."""
    parser = build_parser(ReadingParser)
    pieces: List[Tuple[str, List[str]]] = []
    i = 0
    while i < len(argv):
        action, attached = _flag_of(parser, argv[i])
        takes = 0
        if action is not None and not attached:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            takes = int(action.nargs is None or (action.nargs == "?" and nxt is not None
                                                 and _flag_of(parser, nxt)[0] is None))
        pieces.append((action.dest if action else "", list(argv[i:i + 1 + takes])))
        i += 1 + takes
    return pieces


def _flag_of(parser: argparse.ArgumentParser, word: str) -> Tuple[Optional[argparse.Action], bool]:
    """(the flag ``word`` names, whether its value is in the word), argparse's rules in its order: the exact
    name, ``name=value``, then a unique prefix or a one-letter flag with its value attached; (None, False)
    for a value (``x``, ``-5``) or a word main.py does not know."""
    actions = parser._option_string_actions
    if word in actions:
        return actions[word], False
    if not word.startswith("-") or len(word) < 2:
        return None, False
    name, equals, _ = word.partition("=")
    if equals and name in actions:
        return actions[name], True
    prefix = name if word.startswith("--") else word
    found = {actions[option] for option in actions if option.startswith(prefix)}
    if not word.startswith("--") and word[:2] in actions:
        found.add(actions[word[:2]])
        attached = True
    else:
        attached = bool(equals)
    return (found.pop(), attached) if len(found) == 1 else (None, False)


def shared_flag_default(dest: str, pfllib: object) -> str:
    """``default: 0.0, or the algorithm's own: Ditto 1, FedProx 0.01``: PFLlib's value and the algorithms
    that take their own."""
    own = own_defaults_by_flag().get(dest, {})
    listed = ", ".join(f"{name} {value:g}" for name, value in own.items())
    return f"default: {pfllib}" + (f", or the algorithm's own: {listed}" if listed else "")


@functools.lru_cache(maxsize=1)
def flag_defaults() -> Dict[str, object]:
    """Every flag's default, by its ``dest``: what a flag a record lacks stands for. The shared
    hyper-parameter flags stand for PFLlib's values (the command line leaves them None, to be filled in
    with the chosen algorithm's)."""
    return {**vars(build_parser().parse_args([])), **flag_values(AlgorithmFlags())}


def check_model_name(name: str) -> None:
    """Refuse an unknown ``-m`` before any data is read, with the closest valid name."""
    if name not in MODELS:
        raise UnknownModelError(unknown_name_message("model", name, MODELS, where_listed=f" (-m: {', '.join(MODELS)})"))


def parse_args(argv: Optional[Sequence[str]] = None) -> RunConfig:
    """The flags of ``argv`` as a :class:`RunConfig`; every value its declarations refuse stops here, in
    one line naming the flags (exit status 2)."""
    return _parsed(build_parser(), argv)


def read_args(argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None) -> RunConfig:
    """What :func:`parse_args` makes of ``argv``, for a caller that checks a command rather than runs it (the
    grid runner): where main.py would stop, ``ValueError`` with its message. ``parser``, from
    ``build_parser(ReadingParser)``, may be passed to read many commands with one."""
    return _parsed(parser or build_parser(ReadingParser), argv)


def _parsed(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> RunConfig:
    config = RunConfig.from_namespace(parser.parse_args(argv))
    problems = config.problems()
    if problems:
        parser.error("; ".join(problems))
    return config


def ray_installed() -> bool:
    """Whether ``import ray`` works (Ray is an optional extra: requirements-distributed.txt)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def setup_problems(config: RunConfig) -> Tuple[List[str], List[str]]:
    """(problems, warnings) of flag combinations that parse but make a run pointless or odd.

    ``main.py`` checks them before any data is read; :func:`parse_args` does not, so that tests may
    still build such servers on purpose (e.g. a round without uploads).
    """
    problems, warnings = [], []
    if config.executor == "ray" and not ray_installed():
        problems.append("--executor ray needs Ray, which is not installed: pip install -r "
                        "requirements-distributed.txt (or run with --executor sequential)")
    if config.executor == "batched":
        from flcore.vmapped.support import batched_problem
        problem = batched_problem(config.algorithm, config.model)
        if problem:
            problems.append(problem)
    problem = dlg_problem(config)
    if problem:
        problems.append(problem)
    if not (0 < config.join_ratio <= 1 and 0 <= config.client_drop_rate < 1 and config.num_clients >= 1):
        return problems, warnings  # already refused by parse_args()
    # The same arithmetic as Server.__init__ and Server.receive_models.
    per_round = max(1, int(config.num_clients * config.join_ratio))
    most = config.num_clients if config.random_join_ratio else per_round
    if config.client_drop_rate > 0:
        if int((1 - config.client_drop_rate) * most) == 0:
            problems.append(
                f"-cdr/--client_drop_rate {config.client_drop_rate} drops every update: of the {most} client(s) "
                f"trained per round int((1 - {config.client_drop_rate}) * {most}) = 0 are aggregated, so the "
                f"model never changes; lower -cdr to at most {1 - 1 / most:.4g} or raise -jr/-nc")
        elif int((1 - config.client_drop_rate) * per_round) == 0:
            warnings.append(f"-cdr/--client_drop_rate {config.client_drop_rate}: rounds that draw {per_round} "
                            f"client(s) (-jr {config.join_ratio} with -rjr) aggregate no update")
    if config.local_epochs == 0:
        warnings.append("-ls/--local_epochs 0: clients run no local epochs, so only an algorithm's own extra "
                        "steps (e.g. FedRep's -pls head epochs) change any model")
    if lag_base(config.algorithm) == "Ditto" and config.algorithm_flags.mu == 0:
        # Only when asked for: left out, -mu is Ditto's own default (1).
        warnings.append("-mu 0 with Ditto: the personal models, which Ditto reports, are not pulled towards the "
                        "global one, so the accuracy is that of Local training; leave -mu out for Ditto's default 1")
    gamma = config.learning_rate_decay_gamma
    if config.learning_rate_decay and math.isfinite(gamma) and gamma > 1:
        warnings.append(f"-ldg/--learning_rate_decay_gamma {gamma} > 1 with -ld: the learning rate grows with "
                        f"every local training")
    return problems, warnings


def dlg_problem(config: RunConfig) -> str:
    """Why ``-dlg`` cannot run with this model, or '': it rebuilds images, by moving continuous inputs."""
    if not config.dlg_eval or config.model in IMAGE_MODELS or config.model not in MODELS:
        return ""
    if config.model in TEXT_MODELS:
        return (f"-dlg/--dlg_eval cannot attack -m {config.model}: the model takes token ids, integers, and DLG "
                f"rebuilds a batch by moving continuous inputs along a gradient; use it with an image model")
    return (f"-dlg/--dlg_eval cannot attack -m {config.model}: DLG's reconstructions are measured as images "
            f"(PSNR and SSIM of pixels), and the model takes no images; use it with an image model")


def unused_flag_warnings(config: RunConfig, argv: Sequence[str]) -> List[str]:
    """A line for each flag ``argv`` gives that the chosen algorithm does not read (``flcore.flag_use``): it
    is accepted, since a command may be shared by several methods, but it changes nothing in this run."""
    record = config.flags()
    unused = unused_flags(config.algorithm, record)
    return [f"{names} is not read by {config.algorithm}, so it changes nothing in this run "
            f"({unused_reason(config.algorithm, dest, record)})"
            for dest, names in flags_given(argv).items() if dest in unused]


def setup_notes(config: RunConfig, argv: Sequence[str] = ()) -> List[str]:
    """What the flags ask for that a run does otherwise than written, or leave to a default that costs
    hours, said once at the start (``argv``: the command, to tell a flag given from one left out)."""
    notes = []
    if argv and "global_rounds" not in _flags_given_or_none(argv):
        notes.append(f"-gr left out: PFLlib's default, {rounds_run(config.global_rounds)}; on a real dataset that "
                     f"takes hours (pass -gr N for fewer)")
    given = _flags_given_or_none(argv) if argv else {}
    if "feature_dim" in given and config.model not in TEXT_MODELS:
        notes.append(f"-fd/--feature_dim {config.feature_dim} changes nothing for -m {config.model}: only the "
                     f"text models ({', '.join(TEXT_MODELS)}) take a feature width")
    if "save_folder_name" in given:
        notes.append(f"-sfn/--save_folder_name {config.save_folder_name} changes nothing: this project saves no "
                     f"PFLlib items (checkpoints go under --results_dir)")
    if "itk" in given and lag_base(config.algorithm) == "FedMTL":
        notes.append(f"-itk/--itk {config.algorithm_flags.itk} is recorded and changes nothing: FedMTL never reads "
                     f"it, as in PFLlib")
    if config.dlg_eval and not uploads_parameters(config.algorithm):
        notes.append(f"-dlg/--dlg_eval changes nothing for {config.algorithm}: its clients upload no model parameters "
                     f"(nothing, or class prototypes or logits), so DLG has no update to attack and no rs_dlg_* "
                     f"series is recorded")
    dlg_only = [names for dest, names in given.items() if dest in ("dlg_gap", "batch_num_per_client")]
    if dlg_only and not config.dlg_eval:
        notes.append(f"{' and '.join(dlg_only)} change{'s' if len(dlg_only) == 1 else ''} nothing without "
                     f"-dlg/--dlg_eval, whose attacks they schedule")
    if config.eval_clients > config.num_clients:
        notes.append(f"--eval_clients {config.eval_clients} is more than the {config.num_clients} clients (-nc), "
                     f"so every client is evaluated, as with --eval_clients 0")
    return notes


def _flags_given_or_none(argv: Sequence[str]) -> Dict[str, str]:
    """:func:`flags_given`, or {} where main.py would stop anyway (it says why itself)."""
    try:
        return flags_given(argv)
    except ValueError:
        return {}
