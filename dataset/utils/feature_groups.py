"""Feature shift by client group: the same labels, images that look different from group to group.

Client ``i`` is in group ``i % G`` (``--feature-groups G``, as ``--label-groups`` groups clients for
concept shift), and every image it holds, train and test, goes through its group's transform:

* ``rotation`` (IFCA's rotated MNIST): group g's images are turned counter-clockwise by g x 90 degrees,
  so G is at most 4 and the images must be square;
* ``corruption`` (CIFAR-10-C): group g's images get the g-th corruption of a list, at one severity
  (1-5); the default list is :data:`DEFAULT_CORRUPTIONS` (group 0 clean), or ``--corruptions a,b,...``
  names one per group (``none`` allowed).

Group 0 of the default transforms is untouched, so a client there holds the bytes an unshifted build
gives it. Noise is drawn from a stream of its own per client (seeded by the split's seed and the client
id), so the partition, the train/test split and every other client are unaffected by it.

The fields recorded in ``config.json`` (:class:`~dataset.utils.generate.PartitionOptions`) are kept in
one canonical form (:func:`feature_shift_fields`): with no shift they are the defaults, which is what a
config written before the option existed is read as.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.client_files import IMAGE_INPUTS
from dataset.utils.feature_shift import (CORRUPTIONS, DEFAULT_SEVERITY, NONE, SEVERITIES, corrupt,
                                         corruption_problem, rotate)
from dataset.utils.partition import PartitionError
from dataset.utils.raw_data import images_to_float

ROTATION, CORRUPTION = "rotation", "corruption"
SHIFT_KINDS = (ROTATION, CORRUPTION)
QUARTER_TURNS = 4
# Group g's corruption when --corruptions is not given: group 0 clean, then CIFAR-10-C's in this order.
DEFAULT_CORRUPTIONS = (NONE, "gaussian_noise", "gaussian_blur", "contrast", "brightness", "jpeg", "pixelate")
# The noise of client i comes from default_rng([seed, NOISE_STREAM, i]): no other stream is touched.
NOISE_STREAM = 0xFEA7

# PartitionOptions' feature-shift fields when there is no shift.
NO_SHIFT: Dict[str, object] = {"feature_groups": 1, "feature_shift": ROTATION,
                               "corruption_severity": DEFAULT_SEVERITY, "corruptions": ""}


class FeatureShiftError(PartitionError):
    """A feature shift that cannot be made; the message names the flag to change."""


def default_corruptions(groups: int) -> str:
    """The corruption list of ``groups`` groups when none is given, comma-separated."""
    if groups > len(DEFAULT_CORRUPTIONS):
        raise FeatureShiftError(f"--feature-groups {groups} needs {groups} corruptions and the default list has "
                                f"{len(DEFAULT_CORRUPTIONS)} ({','.join(DEFAULT_CORRUPTIONS)}); lower "
                                f"--feature-groups or name {groups} with --corruptions")
    return ",".join(DEFAULT_CORRUPTIONS[:groups])


def feature_shift_fields(groups: int, kind: Optional[str] = None, severity: Optional[int] = None,
                         corruptions: Optional[str] = None, num_clients: int = 0) -> Dict[str, object]:
    """The canonical PartitionOptions fields of a feature shift; ``None`` = not given.

    Raises :class:`FeatureShiftError` for a shift that cannot be made: G outside 1..``num_clients``
    (not checked when ``num_clients`` is 0), options without G > 1, an unknown kind, more than four
    rotation groups, options of the other kind, a severity outside 1-5, an unknown corruption name or a
    list whose length is not G."""
    if groups < 1 or (num_clients and groups > num_clients):
        bound = f"--num-clients ({num_clients})" if num_clients else "the number of clients"
        raise FeatureShiftError(f"--feature-groups must be between 1 and {bound}, got {groups}")
    given = [flag for flag, value in (("--feature-shift", kind), ("--severity", severity),
                                      ("--corruptions", corruptions)) if value is not None]
    if groups == 1:
        if given:
            raise FeatureShiftError(f"{_listed(given, 'needs', 'need')} --feature-groups G >= 2 (client i gets "
                                    f"group i % G's transform); with one group nothing is shifted")
        return dict(NO_SHIFT)
    kind = ROTATION if kind is None else kind
    if kind not in SHIFT_KINDS:
        raise FeatureShiftError(f"--feature-shift must be one of {', '.join(SHIFT_KINDS)}, got {kind!r}")
    if kind == ROTATION:
        others = [flag for flag in given if flag != "--feature-shift"]
        if others:
            raise FeatureShiftError(f"{_listed(others, 'applies', 'apply')} to --feature-shift corruption only")
        if groups > QUARTER_TURNS:
            raise FeatureShiftError(f"--feature-shift rotation has {QUARTER_TURNS} distinct quarter turns, so "
                                    f"--feature-groups must be at most {QUARTER_TURNS}, got {groups}")
        return dict(NO_SHIFT, feature_groups=groups)
    severity = DEFAULT_SEVERITY if severity is None else severity
    if severity not in SEVERITIES:
        raise FeatureShiftError(f"--severity must be one of {', '.join(map(str, SEVERITIES))}, got {severity}")
    names = corruptions or default_corruptions(groups)
    listed = [name.strip() for name in names.split(",")]
    unknown = [name for name in listed if name != NONE and name not in CORRUPTIONS]
    if unknown:
        raise FeatureShiftError(f"unknown corruption {unknown[0]!r} in --corruptions; choose from "
                                f"{', '.join((NONE, *CORRUPTIONS))}")
    if len(listed) != groups:
        raise FeatureShiftError(f"--corruptions names {len(listed)} corruptions for --feature-groups {groups}; "
                                f"give one per group (none for a clean group)")
    return dict(NO_SHIFT, feature_groups=groups, feature_shift=CORRUPTION, corruption_severity=severity,
                corruptions=",".join(listed))


# ----- the command line -----
def add_feature_shift_arguments(parser: argparse.ArgumentParser) -> None:
    """``--feature-groups``, ``--feature-shift``, ``--severity`` and ``--corruptions``; whole numbers are
    read as text and checked by :func:`feature_shift_from_args`, so a bad one is one ``error:`` line."""
    parser.add_argument("--feature-groups", default=None, metavar="G",
                        help="feature shift: client i gets group i %% G's image transform (1 = none; images only)")
    parser.add_argument("--feature-shift", default=None, metavar="{rotation,corruption}",
                        help="rotation: group g turned by g x 90 degrees (G <= 4, square images); corruption: "
                             "group g gets the g-th of --corruptions (default: rotation)")
    parser.add_argument("--severity", default=None, metavar="S",
                        help=f"strength of the corruptions, 1-5 (default {DEFAULT_SEVERITY}; corruption only)")
    parser.add_argument("--corruptions", default=None, metavar="A,B,...",
                        help=f"one corruption per group, of {', '.join((NONE, *CORRUPTIONS))} (default: the "
                             f"first G of {','.join(DEFAULT_CORRUPTIONS)})")


def feature_shift_requested(args: argparse.Namespace) -> bool:
    return any(getattr(args, key) is not None for key in ("feature_groups", "feature_shift", "severity", "corruptions"))


def feature_shift_from_args(args: argparse.Namespace, num_clients: int = 0) -> Dict[str, object]:
    """The canonical fields :func:`add_feature_shift_arguments`' flags ask for."""
    groups = 1 if args.feature_groups is None else _whole(args.feature_groups, "--feature-groups")
    severity = None if args.severity is None else _whole(args.severity, "--severity")
    return feature_shift_fields(groups, args.feature_shift, severity, args.corruptions, num_clients)


def refuse_feature_shift(args: argparse.Namespace, dataset: str, inputs: str) -> None:
    """Raise for a feature shift asked of a generator whose samples are not images (``inputs`` says what)."""
    if feature_shift_requested(args):
        raise FeatureShiftError(f"{dataset} holds {inputs}, not images: a feature shift (--feature-groups, "
                                f"--feature-shift, --severity, --corruptions) applies to image datasets only")


def _listed(flags: Sequence[str], one: str, several: str) -> str:
    """``--a needs`` or ``--a and --b need``."""
    return f"{' and '.join(flags)} {one if len(flags) == 1 else several}"


def _whole(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FeatureShiftError(f"{flag} must be a whole number, got {text!r}") from None


# ----- applying it to a client's images -----
@dataclass(frozen=True)
class FeatureShift:
    """A feature shift as the pipeline applies it; ``None`` from :func:`feature_shift_of` when there is none."""
    groups: int
    kind: str
    severity: int
    corruptions: Tuple[str, ...]
    seed: int

    def noise_stream(self, client_id: int) -> np.random.Generator:
        """Client ``client_id``'s own noise, drawn for its train images and then its test images."""
        return np.random.default_rng([self.seed, NOISE_STREAM, client_id])

    def apply(self, x: np.ndarray, client_id: int, noise: np.random.Generator) -> np.ndarray:
        """Client ``client_id``'s images (float32 N x C x H x W in [-1, 1], as stored) under its group's
        transform; the same array when the transform is the identity."""
        group = client_id % self.groups
        if self.kind == ROTATION:
            return rotate(x, group) if group else x
        name = self.corruptions[group]
        if name == NONE:
            return x
        return pixels_to_floats(corrupt(floats_to_pixels(x), name, self.severity, noise))

    def images_problem(self, x: np.ndarray, input_kind: str, num_clients: int) -> Optional[str]:
        """Why ``x`` (every sample, before partitioning) cannot take this shift, or None."""
        if self.groups > num_clients:
            return f"--feature-groups {self.groups} is more than the {num_clients} clients"
        if input_kind != IMAGE_INPUTS or x.ndim != 4:
            return f"a feature shift needs images (N x C x H x W); these inputs are {input_kind} of shape {x.shape}"
        channels, height, width = x.shape[1:]
        if self.kind == ROTATION:
            return None if height == width else f"rotation needs square images; these are {height}x{width}"
        for name in dict.fromkeys(self.corruptions):
            problem = None if name == NONE else corruption_problem(name, channels, height, width)
            if problem:
                return f"--corruptions: {problem}"
        if x.size and (x.min() < -1 or x.max() > 1):
            return (f"corruptions work on 8-bit images stored in [-1, 1]; these values span "
                    f"{x.min():g} to {x.max():g}")
        return None


def feature_shift_of(options) -> Optional[FeatureShift]:
    """The :class:`FeatureShift` of a ``PartitionOptions`` (None for one group: no shift). The fields are
    checked again, so options built in code are held to what the command line accepts."""
    if options.feature_groups == 1:
        return None
    is_corruption = options.feature_shift == CORRUPTION
    severity, corruptions = options.corruption_severity, options.corruptions
    fields = feature_shift_fields(options.feature_groups, options.feature_shift,
                                  severity if is_corruption or severity != NO_SHIFT["corruption_severity"] else None,
                                  corruptions if is_corruption or corruptions else None)
    names = tuple(str(fields["corruptions"]).split(",")) if is_corruption else ()
    return FeatureShift(options.feature_groups, options.feature_shift, options.corruption_severity, names,
                        options.seed)


def floats_to_pixels(x: np.ndarray) -> np.ndarray:
    """Stored images (float32 in [-1, 1]) as uint8 pixels, the inverse of ``images_to_float``."""
    return np.rint(np.clip((x.astype(np.float64) + 1.0) * 127.5, 0, 255)).astype(np.uint8)


def pixels_to_floats(pixels: np.ndarray) -> np.ndarray:
    """uint8 N x C x H x W -> the stored float32 form, by the generators' own ``images_to_float``."""
    return images_to_float(pixels.transpose(0, 2, 3, 1))

