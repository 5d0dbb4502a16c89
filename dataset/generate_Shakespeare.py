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
import sys
from functools import partial
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.generate import GenerateError  # noqa: E402
from dataset.utils.leaf import read_users  # noqa: E402
from dataset.utils.natural import Groups  # noqa: E402
from dataset.utils.natural import main as natural_main  # noqa: E402
from dataset.utils.text import character_alphabet, character_ids, token_inputs  # noqa: E402

NAME = "Shakespeare"
SOURCE_HINT = ("pass --source: LEAF's Shakespeare JSON (users, user_data with x and y), or a folder of such "
               "files, made by data/shakespeare/preprocess.sh of github.com/TalwalkarLab/leaf")

Roles = Dict[str, Tuple[List[str], List[str]]]  # role -> (strings, next characters)


def read_roles(source: Path) -> Roles:
    """Every role's samples from one LEAF JSON file or all ``*.json`` files of a folder (in name order)."""
    return read_users(source, noun="role")


def encode_roles(roles: Roles, chosen: Sequence[str]):
    """(x, y, inputs): the chosen roles' samples as character ids, role after role. The alphabet is
    the chosen roles' characters only."""
    strings = [s for role in chosen for s in roles[role][0]]
    targets = [t for role in chosen for t in roles[role][1]]
    lengths = {len(s) for s in strings}
    if len(lengths) != 1 or len(targets) != len(strings) or any(len(t) != 1 for t in targets):
        raise DatasetFileError(f"every x must be a string of one length (found lengths {sorted(lengths)[:5]}) and "
                               f"every y one character, as many as x")
    alphabet = character_alphabet(strings + targets)
    x = character_ids(strings, alphabet)
    y = character_ids(targets, alphabet)[:, 0]
    return x, y, token_inputs(len(alphabet) + 1, x.shape[1])


def load_roles(source, raw_dir) -> Groups:
    """The roles of LEAF's files; there is nothing to download (``raw_dir`` stays unused)."""
    if source is None:
        raise GenerateError(SOURCE_HINT)
    roles = read_roles(Path(source))
    return Groups({role: len(strings) for role, (strings, _) in roles.items()}, partial(encode_roles, roles))


def main(argv: Sequence[str]) -> int:
    return natural_main(NAME, load_roles, argv, unit="role", description=__doc__.split("\n\n")[0],
                        source_help="LEAF JSON file, or a folder of them", inputs="texts")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
