"""UCI Human Activity Recognition (smartphone inertial signals) with its natural split: one client per subject.

The release (Anguita et al. 2013, UCI dataset 240): 30 volunteers wore a smartphone on the waist through
six activities; its signals, sampled at 50 Hz, were cut into windows of 2.56 s (128 steps, 50% overlap).
Of its files this reads the raw signals, not the 561 features derived from them, for split = train, test::

    <split>/Inertial Signals/{body_acc,body_gyro,total_acc}_{x,y,z}_<split>.txt  one window a line, 128 values
    <split>/y_<split>.txt          each window's activity, 1-6 (WALKING ... LAYING): labels 0-5 here
    <split>/subject_<split>.txt    each window's volunteer, 1-30

A window is float32 (9, 1, 128): the nine signals in that order (accelerations in g, angular velocities
in rad/s) over one row of 128 steps, which is how HARCNN takes sensor windows. The release's own split
(21 volunteers train, 9 test) is not kept: a subject's windows from either file are pooled, and each
subject is one client whose windows are split 75/25 into train and test like every other dataset.
``--num-clients N`` keeps the N subjects with the most windows (0, the default: all). Usage::

    python dataset/generate_HAR.py                                    # downloads the zip (about 60 MB)
    python dataset/generate_HAR.py --source "UCI HAR Dataset.zip"     # or the extracted "UCI HAR Dataset/"
    python system/main.py -data HAR -m HARCNN -nc 30
"""
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.natural import Groups, by_subject  # noqa: E402
from dataset.utils.natural import main as natural_main  # noqa: E402
from dataset.utils.release import ReleaseFiles, download_zip  # noqa: E402

NAME = "HAR"
URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00240/UCI%20HAR%20Dataset.zip"
SPLITS = ("train", "test")
SIGNALS = tuple(f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz")
STEPS = 128
SAMPLING_HZ = 50
ACTIVITIES = ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING")  # ids 1-6
MARKER = "train/Inertial Signals/"
WHAT = "the UCI HAR release (UCI HAR Dataset.zip, or its folder with train/ and test/)"
SOURCE_HELP = ("build offline from a local copy: UCI HAR Dataset.zip, or the 'UCI HAR Dataset' folder it "
               "extracts to (train/ and test/, each with Inertial Signals/, y_<split>.txt and subject_<split>.txt)")


def whole_numbers(files: ReleaseFiles, relative: str, low: int, high: Optional[int] = None) -> np.ndarray:
    """A file of one whole number a line, each at least ``low`` (and at most ``high``), as int64."""
    expected = f"one whole number {f'from {low} to {high}' if high is not None else f'of at least {low}'} a line"
    table = files.read_table(relative)
    if table.shape[1] != 1:
        raise DatasetFileError(f"{files.where(relative)} has {table.shape[1]} values a line; expected {expected}")
    values = table[:, 0]
    bad = values[(values != np.round(values)) | (values < low) | (values > (np.inf if high is None else high))]
    if bad.size:  # NaN, unequal to itself, is caught by the first test
        raise DatasetFileError(f"{files.where(relative)} holds {bad[0]:g}; expected {expected}")
    return values.astype(np.int64)


def read_split(files: ReleaseFiles, split: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, subjects)`` of one of the release's splits; every file must describe the same windows."""
    y = whole_numbers(files, f"{split}/y_{split}.txt", 1, len(ACTIVITIES)) - 1
    subjects = whole_numbers(files, f"{split}/subject_{split}.txt", 1)
    if len(subjects) != len(y):
        raise DatasetFileError(f"{files.where(f'{split}/subject_{split}.txt')} has {len(subjects)} lines but "
                               f"y_{split}.txt has {len(y)}; both give one line per window")
    signals = []
    for signal in SIGNALS:
        relative = f"{split}/Inertial Signals/{signal}_{split}.txt"
        table = files.read_table(relative, dtype=np.float32)
        if table.shape != (len(y), STEPS):
            raise DatasetFileError(f"{files.where(relative)} holds {table.shape[0]} windows of {table.shape[1]} "
                                   f"steps; expected {len(y)} (one per line of y_{split}.txt) of {STEPS}")
        signals.append(table)
    return np.stack(signals, axis=1)[:, :, None, :], y, subjects


def load_windows(source, raw_dir) -> Groups:
    """Every window of both splits, grouped by subject; the zip is downloaded when there is no --source."""
    if source is None:
        source = download_zip(URL, raw_dir, MARKER, "UCI HAR", SOURCE_HELP)
    files = ReleaseFiles(source, MARKER, WHAT)
    x, y, subjects = (np.concatenate(parts) for parts in zip(*(read_split(files, split) for split in SPLITS)))
    inputs = {"channels": list(SIGNALS), "sampling_hz": SAMPLING_HZ, "label_names": list(ACTIVITIES)}
    return by_subject(x, y, subjects, len(ACTIVITIES), inputs)


def main(argv: Sequence[str]) -> int:
    return natural_main(NAME, load_windows, argv, unit="subject", description=__doc__.split("\n\n")[0],
                        source_help=SOURCE_HELP, inputs="sensor windows")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
