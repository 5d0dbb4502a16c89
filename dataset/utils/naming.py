"""Partition names of dataset folders: ``<Base>-<partition>`` (``MNIST-dir0.1``), with ``-lg<G>`` for
concept shift, a feature-shift word (``-rot4``, ``-cor4``) and ``-nc<N>`` for a client count other than the
default (``Digits-iid-lg4-nc40``, ``MNIST-dir0.1-rot4``), the key and label of a split as the generators
record it in ``config.json``, and the feature-shift word itself, written and read back.

A feature-shift word is ``rot<G>`` (rotation, G groups) or ``cor<G>`` (corruption, G groups), the
latter followed by ``s<S>`` when the severity is not the default 3 and by ``+<name>`` for each group
when the corruptions are not the default list (``cor3s5+none+blur+jpeg``). Corruptions go by short
names there, with no ``_``, which separates the fields of a result file's name.
"""
from __future__ import annotations

import re
from typing import Dict, Mapping, Optional, Tuple

from dataset.utils.feature_groups import CORRUPTION, DEFAULT_CORRUPTIONS, NO_SHIFT, ROTATION

PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-(?P<partition>iid|(?:ex)?dir\d*\.?\d+(?:e-?\d+)?|pat\d+)"
                              r"(?:-lg(?P<groups>\d+))?(?:-(?P<shift>rot\d+|cor\d+[a-z0-9+]*))?(?:-nc\d+)?$")


def with_shifts(key: str, label: str, groups: int, shift: str = "") -> Tuple[str, str]:
    """(key, label) of a split whose clients fall into ``groups`` label groups (concept shift) and carry the
    feature-shift word ``shift``: ``iid-lg4``, ``IID, 4 label groups``; ``dir0.1-rot4``, ``Dir(0.1), rot4``;
    unchanged without either."""
    if groups > 1:
        key, label = f"{key}-lg{groups}", f"{label}, {groups} label groups"
    if shift:
        key, label = f"{key}-{shift}", f"{label}, {shift}"
    return key, label


def partition_from_config(config: Mapping[str, object]) -> Tuple[str, str]:
    """(key, label) of a dataset ``config.json``: dir0.1 / Dir(0.1), pat2 / Pat(2), iid / IID, and
    iid-lg4 / IID, 4 label groups under concept shift."""
    key, label = _scheme_from_config(config)
    return with_shifts(key, label, int(config.get("label_groups", 1) or 1), feature_shift_word(config))


def _scheme_from_config(config: Mapping[str, object]) -> Tuple[str, str]:
    scheme = str(config.get("partition", ""))
    if not config.get("non_iid", True) or scheme in ("iid", "-"):
        return "iid", "IID"
    if scheme in ("dir", "exdir"):
        alpha = f"{float(config.get('alpha', 0.1)):g}"
        return f"{scheme}{alpha}", f"{'Dir' if scheme == 'dir' else 'ExDir'}({alpha})"
    if scheme == "pat":
        k = int(config.get("class_per_client", 2))
        return f"pat{k}", f"Pat({k})"
    return scheme or "?", scheme or "?"


def partition_from_name(name: str) -> Tuple[str, str]:
    """(key, label) from the naming convention ``<Base>-<partition>[-lg<G>][-nc<N>]`` (``MNIST-dir0.1``,
    ``Digits-iid-lg4-nc40``), else ("", "")."""
    match = PARTITION_SUFFIX.match(name)
    if not match:
        return "", ""
    token = match.group("partition")
    kind = re.match(r"[a-z]*", token).group(0)
    groups, shift = int(match.group("groups") or 1), match.group("shift") or ""
    if kind == "iid":
        return with_shifts("iid", "IID", groups, shift)
    # The same key and label as partition_from_config gives for that split (dir1.0 -> dir1, Dir(1)).
    number = f"{float(token[len(kind):]):g}" if kind != "pat" else str(int(token[len(kind):]))
    label = {"dir": f"Dir({number})", "exdir": f"ExDir({number})", "pat": f"Pat({number})"}[kind]
    return with_shifts(f"{kind}{number}", label, groups, shift)


# Each corruption's name in folder names.
CORRUPTION_WORDS = {"none": "none", "gaussian_noise": "noise", "gaussian_blur": "blur", "contrast": "contrast",
                    "brightness": "bright", "jpeg": "jpeg", "pixelate": "pixel"}
_CORRUPTION_OF_WORD = {word: name for name, word in CORRUPTION_WORDS.items()}
SHIFT_WORD = re.compile(r"^(?:rot(?P<rotations>[0-9]+)|cor(?P<groups>[0-9]+)(?:s(?P<severity>[0-9]+))?"
                        r"(?P<names>(?:\+[a-z]+)*))$")


def feature_shift_word(fields: Mapping[str, object]) -> str:
    """The folder-name word of the feature shift that PartitionOptions' ``fields`` record ('' for none)."""
    groups = int(fields.get("feature_groups", 1))
    if groups == 1:
        return ""
    if fields.get("feature_shift", ROTATION) != CORRUPTION:
        return f"rot{groups}"
    word = f"cor{groups}"
    severity = int(fields.get("corruption_severity", NO_SHIFT["corruption_severity"]))
    if severity != NO_SHIFT["corruption_severity"]:
        word += f"s{severity}"
    names = str(fields.get("corruptions") or "")
    if names and names != ",".join(DEFAULT_CORRUPTIONS[:groups]):
        word += "".join(f"+{CORRUPTION_WORDS.get(name, name)}" for name in names.split(","))
    return word


def feature_shift_from_word(word: str) -> Optional[Dict[str, object]]:
    """PartitionOptions' feature-shift fields that a folder-name word spells, or None when it is not one.

    Read as written, not checked: ``cor9`` (more groups than default corruptions) comes back as asked, and
    the generator that builds it says what is wrong."""
    match = SHIFT_WORD.match(word)
    if not match:
        return None
    if match.group("rotations"):
        return dict(NO_SHIFT, feature_groups=int(match.group("rotations")))
    groups = int(match.group("groups"))
    words = match.group("names").split("+")[1:]
    if any(w not in _CORRUPTION_OF_WORD for w in words):
        return None
    names = [_CORRUPTION_OF_WORD[w] for w in words] or list(DEFAULT_CORRUPTIONS[:groups])
    severity = match.group("severity")
    return dict(NO_SHIFT, feature_groups=groups, feature_shift=CORRUPTION,
                corruption_severity=int(severity) if severity else NO_SHIFT["corruption_severity"],
                corruptions=",".join(names) if groups <= len(DEFAULT_CORRUPTIONS) or words else "")
