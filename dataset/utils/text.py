"""Texts -> fixed-length int64 token ids, the inputs of the text models (``-m TextCNN``, ``LSTM``, ...).

Every step is simple and deterministic, so the same text always gives the same arrays:

* tokenise: lower-case, then keep each run of letters and digits (everything else separates words);
* vocabulary: the training text's tokens by descending count, ties in alphabetical order, capped at
  ``vocab_size`` ids including two reserved ones: :data:`PAD_ID` 0 and :data:`UNKNOWN_ID` 1;
* encode: a token outside the vocabulary becomes 1; keep the first ``max_len`` ids, right-pad with 0.

Id 0 must stay padding: the text models take a sequence to end at its last non-zero id.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.client_files import TOKEN_INPUTS, DatasetFileError
from dataset.utils.source_arrays import check_labels, read_source_npz

PAD_ID = 0
UNKNOWN_ID = 1
RESERVED_IDS = 2

# A run of letters or digits in any script; ``\W`` is "not a word character", and "_" is excluded so
# that it separates words like any other punctuation.
_WORD = re.compile(r"[^\W_]+")


def tokenize(text: str) -> List[str]:
    return _WORD.findall(text.lower())


def build_vocabulary(token_lists: Iterable[Sequence[str]], vocab_size: int) -> Dict[str, int]:
    """``{token: id}`` for the ``vocab_size - 2`` most frequent tokens, ids from 2 in that order.

    Ties are broken alphabetically so the vocabulary does not depend on the order of the texts."""
    if vocab_size <= RESERVED_IDS:
        raise ValueError(f"--vocab-size must be above {RESERVED_IDS} (padding and unknown are reserved), "
                         f"got {vocab_size}")
    counts = Counter(token for tokens in token_lists for token in tokens)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab_size - RESERVED_IDS]
    return {token: RESERVED_IDS + rank for rank, (token, _) in enumerate(ranked)}


def encode(token_lists: Sequence[Sequence[str]], vocabulary: Dict[str, int], max_len: int) -> np.ndarray:
    """(N, max_len) int64 ids: each text's first ``max_len`` tokens, unknown ones as 1, padded with 0."""
    ids = np.full((len(token_lists), max_len), PAD_ID, dtype=np.int64)
    for row, tokens in enumerate(token_lists):
        kept = [vocabulary.get(token, UNKNOWN_ID) for token in tokens[:max_len]]
        ids[row, :len(kept)] = kept
    return ids


def token_inputs(vocab_size: int, max_len: int) -> dict:
    """What ``config.json`` says about token inputs: their kind, the id bound and the sequence length."""
    return {"input_kind": TOKEN_INPUTS, "vocab_size": int(vocab_size), "max_len": int(max_len)}


def encode_texts(train_texts: Sequence[str], other_texts: Sequence[str], vocab_size: int,
                 max_len: int) -> Tuple[np.ndarray, dict]:
    """Token ids of ``train_texts`` followed by ``other_texts``, with the vocabulary built from the
    training texts only (as a held-out split would see it), and the config entries describing them.

    The recorded ``vocab_size`` is the number of ids in use, which is below the cap when the text has
    fewer distinct tokens: a model needs ``-vs`` at least that large."""
    train_tokens = [tokenize(text) for text in train_texts]
    other_tokens = [tokenize(text) for text in other_texts]
    vocabulary = build_vocabulary(train_tokens, vocab_size)
    x = encode(train_tokens + other_tokens, vocabulary, max_len)
    return x, token_inputs(RESERVED_IDS + len(vocabulary), max_len)


def character_alphabet(strings: Iterable[str]) -> str:
    """Every character the strings use, in code-point order; character ``i`` of it gets id ``i + 1``
    (id 0 stays padding, and no character is unknown)."""
    return "".join(sorted(set().union(*map(set, strings))))


def character_ids(strings: Sequence[str], alphabet: str) -> np.ndarray:
    """(N, L) int64 ids of N strings of one length L over ``alphabet`` (vectorised: one pass over the
    code points of all strings joined, not a Python loop per character)."""
    if not strings:
        return np.zeros((0, 0), dtype=np.int64)
    code_points = np.frombuffer("".join(strings).encode("utf-32-le"), dtype=np.uint32)
    table = np.frombuffer(alphabet.encode("utf-32-le"), dtype=np.uint32)  # sorted, as the alphabet is
    return (np.searchsorted(table, code_points) + 1).astype(np.int64).reshape(len(strings), -1)


TOKEN_FORM = "integer token ids of shape (N, L)"


def _token_form_problem(shape, dtype) -> Optional[str]:
    if len(shape) != 2 or dtype.kind not in "iu":
        return f"x must hold {TOKEN_FORM}; got {dtype} {tuple(shape)}"
    return None


def load_token_npz(source: Path, vocab_size: int, max_len: int) -> Tuple[np.ndarray, np.ndarray, dict]:
    """An already tokenised copy of a text dataset: integer ``x`` (N x L, 0 = padding) and ``y``.

    Rows are cut or right-padded to ``max_len``; an id at or above ``vocab_size`` is refused, since
    mapping it to "unknown" would silently assume the ids are ranked by frequency."""
    x, y = read_source_npz(source, TOKEN_FORM, _token_form_problem)
    y = check_labels(y, str(source))
    if x.size and x.min() < 0:
        raise DatasetFileError(f"{source}: token id {int(x.min())} is negative; ids are 0 (padding) and up")
    if x.size and x.max() >= vocab_size:
        raise DatasetFileError(f"{source}: token ids reach {int(x.max())}, at or above --vocab-size {vocab_size}; "
                               f"pass --vocab-size {int(x.max()) + 1} or more")
    ids = np.full((len(x), max_len), PAD_ID, dtype=np.int64)
    width = min(max_len, x.shape[1])
    ids[:, :width] = x[:, :width]
    used = int(ids.max()) + 1 if ids.size else RESERVED_IDS
    return ids, y.astype(np.int64), token_inputs(max(used, RESERVED_IDS), max_len)
