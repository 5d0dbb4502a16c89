"""PAMAP2 physical activity monitoring with its natural split: one client per subject.

The release (Reiss and Stricker 2012, UCI dataset 231): 9 subjects wore three IMUs (hand, chest, ankle)
and a heart-rate monitor through a protocol of 12 activities. ``Protocol/subject101.dat`` ..
``subject109.dat`` hold one line per 100 Hz step of 54 space-separated columns: timestamp (s), activity
id, heart rate, then 17 per IMU (temperature, 3D acceleration +-16 g, 3D acceleration +-6 g, 3D
gyroscope, 3D magnetometer, 4 orientation values the release calls invalid); a sensor's dropouts are
``NaN``. The preprocessing, the usual one for this dataset, makes these choices:

* files: ``Protocol/`` only, every ``subject<id>.dat`` there (``Optional/``'s extra activities are left out);
* classes: the 12 protocol activities (ids 1-7, 12, 13, 16, 17, 24) as labels 0-11 in id order, the
  mapping recorded in config.json (``label_activity_ids``, ``label_names``); activity 0 (transient, between
  activities) and any other id are dropped;
* channels: the +-16 g accelerometer and the gyroscope of each IMU, hand then chest then ankle: 18
  (the +-6 g accelerometer saturates in fast motion, the magnetometer depends on the room, the heart
  rate is sampled at about 9 Hz); accelerations are divided by 9.80665 to be in g, as HAR's are, and
  angular velocities stay in rad/s. No other normalisation, so no statistic of the test data enters;
* gaps: each channel's NaNs are filled by linear interpolation along the subject's recording (a gap at
  either end takes the nearest value);
* windows: ``--window`` steps (default 256, 2.56 s, PFLlib's length) every ``--step`` steps (default 128,
  50% overlap), cut inside each unbroken run of one activity, so a window's label is the one activity it
  holds throughout; a run shorter than a window gives none.

A window is float32 (18, 1, window), how HARCNN takes sensor windows. Each subject is one client whose
windows are split 75/25 into train and test like every other dataset; ``--num-clients N`` keeps the N
subjects with the most windows (0, the default: all). Usage::

    python dataset/generate_PAMAP2.py                                  # downloads the zip (about 650 MB)
    python dataset/generate_PAMAP2.py --source PAMAP2_Dataset.zip      # or the extracted PAMAP2_Dataset/
    python dataset/generate_PAMAP2.py --window 128 --step 64 --name PAMAP2-w128
    python system/main.py -data PAMAP2 -m HARCNN -nc 9
"""
import re
import sys
from pathlib import Path
from typing import Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.generate import GeneratorSetting  # noqa: E402
from dataset.utils.natural import Groups, by_subject  # noqa: E402
from dataset.utils.natural import main as natural_main  # noqa: E402
from dataset.utils.release import ReleaseFiles, download_zip  # noqa: E402

NAME = "PAMAP2"
URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00231/PAMAP2_Dataset.zip"
PROTOCOL = "Protocol"
SUBJECT_FILE = re.compile(r"subject(\d+)\.dat")
COLUMNS = 54
ACTIVITY_COLUMN = 1
IMUS = {"hand": 3, "chest": 20, "ankle": 37}  # each IMU's first column (temperature) of its 17
SENSORS = {"acc16": (1, 2, 3), "gyro": (7, 8, 9)}  # x, y, z columns within an IMU's 17
CHANNELS = tuple((f"{imu}_{sensor}_{axis}", first + offset) for imu, first in IMUS.items()
                 for sensor, offsets in SENSORS.items() for axis, offset in zip("xyz", offsets))
GRAVITY = 9.80665  # m/s^2 in one g
SAMPLING_HZ = 100
ACTIVITIES = {1: "lying", 2: "sitting", 3: "standing", 4: "walking", 5: "running", 6: "cycling",
              7: "Nordic walking", 12: "ascending stairs", 13: "descending stairs", 16: "vacuum cleaning",
              17: "ironing", 24: "rope jumping"}  # activity id -> name; label = rank of the id
LABELS = {activity: label for label, activity in enumerate(sorted(ACTIVITIES))}

SETTINGS = (
    GeneratorSetting("--window", 256, "steps per window at 100 Hz (256: 2.56 s; HARCNN needs at least 28)",
                     minimum=28),
    GeneratorSetting("--step", 128, "steps from one window's start to the next (128 with --window 256: 50%% "
                                    "overlap)"),
)
WHAT = "the PAMAP2 release (PAMAP2_Dataset.zip, or its folder with Protocol/subject<id>.dat)"
SOURCE_HELP = ("build offline from a local copy: PAMAP2_Dataset.zip, or the PAMAP2_Dataset folder it extracts "
               "to (Protocol/subject101.dat .. subject109.dat)")


def fill_gaps(signals: np.ndarray, where: str) -> np.ndarray:
    """Each column's NaNs replaced by linear interpolation between its nearest values (in place)."""
    steps = np.arange(len(signals))
    for column, (name, _) in enumerate(CHANNELS):
        values = signals[:, column]
        missing = np.isnan(values)
        if missing.all():
            raise DatasetFileError(f"{where}: channel {name} holds no value at all (only NaN)")
        if missing.any():
            values[missing] = np.interp(steps[missing], steps[~missing], values[~missing])
    return signals


def read_subject(files: ReleaseFiles, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(activity ids, signals)`` of one recording: int64 (T,) and float64 (T, channels), gaps filled."""
    relative = f"{PROTOCOL}/{name}"
    table = files.read_table(relative)
    where = files.where(relative)
    if table.shape[1] != COLUMNS:
        raise DatasetFileError(f"{where} has {table.shape[1]} columns; expected {COLUMNS} (timestamp, activity id, "
                               f"heart rate, 17 per IMU)")
    activity = table[:, ACTIVITY_COLUMN]
    if not np.all(activity == np.round(activity)):
        raise DatasetFileError(f"{where}: column 2 (activity id) holds a value that is not a whole number")
    signals = table[:, [column for _, column in CHANNELS]]
    signals[:, [i for i, (channel, _) in enumerate(CHANNELS) if "_acc" in channel]] /= GRAVITY
    return activity.astype(np.int64), fill_gaps(signals, where)


def activity_windows(activity: np.ndarray, signals: np.ndarray, window: int,
                     step: int) -> Tuple[np.ndarray, np.ndarray]:
    """The windows cut inside each run of one protocol activity: float32 (M, channels, 1, window), labels (M,)."""
    change = np.flatnonzero(activity[1:] != activity[:-1]) + 1
    runs = zip(np.concatenate([[0], change]), np.concatenate([change, [len(activity)]]))
    starts = [np.arange(start, stop - window + 1, step) for start, stop in runs if activity[start] in LABELS]
    starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    x = signals.astype(np.float32)[starts[:, None] + np.arange(window)].transpose(0, 2, 1)[:, :, None, :]
    y = np.array([LABELS[a] for a in activity[starts]], dtype=np.int64)
    return x, y


def load_windows(source, raw_dir, *, window: int, step: int) -> Groups:
    """Every subject's windows; the zip is downloaded when there is no --source."""
    if source is None:
        source = download_zip(URL, raw_dir, f"{PROTOCOL}/", NAME, SOURCE_HELP)
    files = ReleaseFiles(source, f"{PROTOCOL}/", WHAT)
    names = [name for name in files.names(PROTOCOL) if SUBJECT_FILE.fullmatch(name)]
    if not names:
        raise DatasetFileError(f"{files.where(PROTOCOL)} holds no subject<id>.dat; expected {WHAT}")
    xs, ys, subjects = [], [], []
    for name in names:
        x, y = activity_windows(*read_subject(files, name), window, step)
        xs.append(x)
        ys.append(y)
        subjects.append(np.full(len(y), int(SUBJECT_FILE.fullmatch(name).group(1)), dtype=np.int64))
    inputs = {"channels": [channel for channel, _ in CHANNELS], "sampling_hz": SAMPLING_HZ,
              "label_activity_ids": sorted(ACTIVITIES), "label_names": [ACTIVITIES[a] for a in sorted(ACTIVITIES)]}
    return by_subject(np.concatenate(xs), np.concatenate(ys), np.concatenate(subjects), len(ACTIVITIES), inputs)


def main(argv: Sequence[str]) -> int:
    return natural_main(NAME, load_windows, argv, unit="subject", description=__doc__.split("\n\n")[0],
                        source_help=SOURCE_HELP, settings=SETTINGS, inputs="sensor windows")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
