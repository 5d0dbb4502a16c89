"""Partition names of dataset folders: ``<Base>-<partition>`` (``MNIST-dir0.1``), with ``-lg<G>`` for
concept shift and ``-nc<N>`` for a client count other than the default (``Digits-iid-lg4-nc40``), and the
key and label of a split as the generators record it in ``config.json``.
"""
from __future__ import annotations

import re
from typing import Mapping, Tuple

PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-(?P<partition>iid|(?:ex)?dir\d*\.?\d+(?:e-?\d+)?|pat\d+)"
                              r"(?:-lg(?P<groups>\d+))?(?:-nc\d+)?$")


def with_label_groups(key: str, label: str, groups: int) -> Tuple[str, str]:
    """(key, label) of a split whose clients fall into ``groups`` label groups (concept shift): ``iid-lg4``,
    ``IID, 4 label groups``; unchanged for one group (no shift)."""
    if groups <= 1:
        return key, label
    return f"{key}-lg{groups}", f"{label}, {groups} label groups"


def partition_from_config(config: Mapping[str, object]) -> Tuple[str, str]:
    """(key, label) of a dataset ``config.json``: dir0.1 / Dir(0.1), pat2 / Pat(2), iid / IID, and
    iid-lg4 / IID, 4 label groups under concept shift."""
    key, label = _scheme_from_config(config)
    return with_label_groups(key, label, int(config.get("label_groups", 1) or 1))


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
    groups = int(match.group("groups") or 1)
    if kind == "iid":
        return with_label_groups("iid", "IID", groups)
    # The same key and label as partition_from_config gives for that split (dir1.0 -> dir1, Dir(1)).
    number = f"{float(token[len(kind):]):g}" if kind != "pat" else str(int(token[len(kind):]))
    label = {"dir": f"Dir({number})", "exdir": f"ExDir({number})", "pat": f"Pat({number})"}[kind]
    return with_label_groups(f"{kind}{number}", label, groups)
