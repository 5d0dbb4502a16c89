"""Partition names of dataset folders: ``<Base>-<partition>`` (``MNIST-dir0.1``) and the key and
label of a split as the generators record it in ``config.json``.
"""
from __future__ import annotations

import re
from typing import Mapping, Tuple

PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-(?P<partition>iid|(?:ex)?dir\d*\.?\d+(?:e-?\d+)?|pat\d+)$")


def partition_from_config(config: Mapping[str, object]) -> Tuple[str, str]:
    """(key, label) of a dataset ``config.json``: dir0.1 / Dir(0.1), pat2 / Pat(2), iid / IID."""
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
    """(key, label) from the naming convention ``<Base>-<partition>`` (``MNIST-dir0.1``), else ("", "")."""
    match = PARTITION_SUFFIX.match(name)
    if not match:
        return "", ""
    token = match.group("partition")
    kind = re.match(r"[a-z]*", token).group(0)
    if kind == "iid":
        return "iid", "IID"
    # The same key and label as partition_from_config gives for that split (dir1.0 -> dir1, Dir(1)).
    number = f"{float(token[len(kind):]):g}" if kind != "pat" else str(int(token[len(kind):]))
    label = {"dir": f"Dir({number})", "exdir": f"ExDir({number})", "pat": f"Pat({number})"}[kind]
    return f"{kind}{number}", label
