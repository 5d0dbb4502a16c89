"""Memory and file sizes as people write them (``2G``, ``512MB``, ``1.5 GiB``) and as the project prints
them (``2.0 GB``)."""
from __future__ import annotations

import argparse
import math
import re

# Decimal and binary units, case-insensitive; a bare number counts bytes.
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of ``text`` (``2G``, ``512MB``, ``1.5GiB``, ``4096``); ValueError for anything else."""
    found = _SIZE.fullmatch(str(text))
    unit = found and _UNITS.get(found.group(2).lower())
    if not unit:
        raise ValueError(f"{text!r} is not a size (write e.g. 512M, 2G or 1.5GiB)")
    count = float(found.group(1)) * unit
    if not math.isfinite(count):
        raise ValueError(f"{text!r} is not a size (write e.g. 512M, 2G or 1.5GiB)")
    return int(count)


def size_flag(text: str) -> str:
    """argparse's ``type`` for a size flag that also takes ``auto``: the text, checked."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        if parse_size(text) <= 0:
            raise ValueError(f"{text!r} is not a positive size")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.strip()


def format_size(count: int) -> str:
    """``2.0 GB``, ``512.0 KB``, ``12 B``: decimal units, one decimal."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
