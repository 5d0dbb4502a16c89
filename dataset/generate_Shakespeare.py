"""Shakespeare next-character prediction (LEAF) with its natural split: one client per speaking role.

Built from LEAF's preprocessed JSON (github.com/TalwalkarLab/leaf, ``data/shakespeare/preprocess.sh``):
``{"users": [...], "user_data": {role: {"x": [80-character strings], "y": [next characters]}}}``. LEAF
downloads the plays and cuts them into roles itself, so there is no download here: ``--source`` is
one such file or a folder of them (e.g. LEAF's ``train/`` and ``test/`` files side by side: a role's
samples are pooled). Every character seen gets an id, in code-point order from 1 (0 stays padding);
a sample is its string's ids, its label the next character's id. Each role's samples are then split
75/25 into train and test like every other dataset::

    python dataset/generate_Shakespeare.py --source leaf/data/shakespeare/data/all_data/
    python dataset/generate_Shakespeare.py noniid - natural --num-clients 100 --source all_data.json
    python system/main.py -data Shakespeare -m LSTM -nc 100        # -vs, -ncl: the dataset's

``--num-clients N`` keeps the N roles with the most samples (0, the default: every role with at least
``--min-samples``); PFLlib's positional argv is accepted, with ``natural`` as the only partition.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.generate import (DATASET_ROOT, GENERATOR_ERRORS, GenerateError, PartitionOptions,  # noqa: E402
                                    already_built, build_dataset, output_folder)
from dataset.utils.partition import PartitionError  # noqa: E402
from dataset.utils.text import character_alphabet, character_ids, token_inputs  # noqa: E402

NAME = "Shakespeare"
NATURAL = "natural"
SOURCE_HINT = ("pass --source: LEAF's Shakespeare JSON (users, user_data with x and y), or a folder of such "
               "files, made by data/shakespeare/preprocess.sh of github.com/TalwalkarLab/leaf")

Roles = Dict[str, Tuple[List[str], List[str]]]  # role -> (strings, next characters)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="generate_Shakespeare.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("niid", nargs="?", default="noniid", help="PFLlib argv[1]: only 'noniid'")
    parser.add_argument("balance", nargs="?", default="-", help="PFLlib argv[2]: only '-'")
    parser.add_argument("partition", nargs="?", default=NATURAL, help=f"PFLlib argv[3]: only '{NATURAL}'")
    parser.add_argument("--source", type=Path, default=None, help="LEAF JSON file, or a folder of them")
    parser.add_argument("--num-clients", type=int, default=0,
                        help="keep the roles with the most samples (0: every role with --min-samples)")
    parser.add_argument("--min-samples", type=int, default=2,
                        help="drop roles with fewer samples (2: one train and one test sample)")
    parser.add_argument("--seed", type=int, default=1, help="seed of each role's train/test split")
    parser.add_argument("--name", default=NAME, help="folder to write, i.e. the -data name")
    parser.add_argument("--root", type=Path, default=DATASET_ROOT, help="parent folder of the dataset folder")
    parser.add_argument("--force", action="store_true", help="rebuild, or replace a folder holding another split")
    return parser.parse_args(list(argv))


def read_roles(source: Path) -> Roles:
    """Every role's samples from one LEAF JSON file or all ``*.json`` files of a folder (in name order)."""
    if source.is_dir():
        files = sorted(source.glob("*.json"))
        if not files:
            raise FileNotFoundError(f"--source folder {source} holds no .json files")
    elif source.is_file():
        files = [source]
    else:
        raise FileNotFoundError(f"--source {source} does not exist")
    roles: Roles = {}
    for path in files:
        try:
            for role, samples in json.loads(path.read_text(encoding="utf-8"))["user_data"].items():
                strings, targets = roles.setdefault(role, ([], []))
                strings += list(samples["x"])
                targets += list(samples["y"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise DatasetFileError(f"{path} is not LEAF JSON: user_data with x and y per role "
                                   f"({type(err).__name__}: {err})") from None
    return roles


def chosen_roles(roles: Roles, num_clients: int, min_samples: int) -> List[str]:
    """The roles that become clients: most samples first, ties by name."""
    ranked = sorted((role for role, (strings, _) in roles.items() if len(strings) >= min_samples),
                    key=lambda role: (-len(roles[role][0]), role))
    if not ranked or num_clients > len(ranked):
        raise PartitionError(f"only {len(ranked)} roles have at least {min_samples} samples; lower --num-clients "
                             f"or --min-samples")
    return ranked[:num_clients or len(ranked)]


def encode_roles(roles: Roles, chosen: List[str]):
    """(x, y, parts, inputs): the chosen roles' samples as character ids, and each role's indices."""
    strings = [s for role in chosen for s in roles[role][0]]
    targets = [t for role in chosen for t in roles[role][1]]
    lengths = {len(s) for s in strings}
    if len(lengths) != 1 or len(targets) != len(strings) or any(len(t) != 1 for t in targets):
        raise DatasetFileError(f"every x must be a string of one length (found lengths {sorted(lengths)[:5]}) and "
                               f"every y one character, as many as x")
    alphabet = character_alphabet(strings + targets)
    x = character_ids(strings, alphabet)
    y = character_ids(targets, alphabet)[:, 0]
    bounds = np.cumsum([0] + [len(roles[role][0]) for role in chosen])
    parts = [np.arange(start, stop, dtype=np.int64) for start, stop in zip(bounds[:-1], bounds[1:])]
    return x, y, parts, token_inputs(len(alphabet) + 1, x.shape[1])


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        if (args.niid, args.balance, args.partition) != ("noniid", "-", NATURAL):
            raise GenerateError(f"Shakespeare keeps its natural split (one client per role); drop "
                                f"'{' '.join((args.niid, args.balance, args.partition))}' or write 'noniid - {NATURAL}'")
        if args.source is None:
            raise GenerateError(SOURCE_HINT)
        if args.min_samples < 2 or args.num_clients < 0:
            raise GenerateError("--min-samples must be >= 2 and --num-clients >= 0")
        out = output_folder(args.root, args.name)
        roles = read_roles(args.source)
        chosen = chosen_roles(roles, args.num_clients, args.min_samples)
        options = PartitionOptions(num_clients=len(chosen), partition=NATURAL, seed=args.seed,
                                   min_samples=args.min_samples)
        if not args.force and already_built(out, options):
            return 0
        x, y, parts, inputs = encode_roles(roles, chosen)
        config = build_dataset(out, x, y, options, source=NAME, parts=parts,
                               extra_config=dict(inputs, client_roles=chosen))
    except GENERATOR_ERRORS as err:
        print(f"error: {err}")
        return 2
    print(f"wrote {config['num_clients']} roles to {out} ({sum(config['train_samples'])} train / "
          f"{sum(config['test_samples'])} test samples, {config['vocab_size']} character ids)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
