"""``--tensorboard``: each round's scalars as TensorBoard event files, written while the run goes.

Events go to ``<results>/tensorboard/<run name>/`` (``tensorboard --logdir results/tensorboard``). The
scalars are the run's 1-D series as recorded that round: accuracy, AUC and train loss of each evaluation
(``rs_test_acc`` ..., ``rs_val_acc`` and ``rs_after_*`` when asked for) and the round time, under their
``.h5`` names with the step = the round. A resumed run drops the events after the round it resumes from,
so the curves have no doubled rounds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from utils.errors import UserError


class TensorBoardError(UserError, RuntimeError):
    """--tensorboard cannot be honoured (the package is missing)."""


def tensorboard_folder(results_file: Path) -> Path:
    return Path(results_file).parent / "tensorboard" / Path(results_file).stem


class TensorBoardLog:
    """Writes the scalars a round added to the history."""

    def __init__(self, folder: Path, first_round: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TensorBoardError("--tensorboard needs the tensorboard package: pip install tensorboard "
                                   "(or run without --tensorboard; the .h5 and .csv hold the same series)") from None
        self.folder = Path(folder)
        self.writer = SummaryWriter(str(folder), purge_step=first_round or None)

    def add_round(self, rnd: int, history: Mapping[str, Sequence]) -> None:
        """The last value of each scalar series that round ``rnd`` recorded."""
        evaluated = bool(history.get("rs_eval_round")) and history["rs_eval_round"][-1] == rnd
        attacked = bool(history.get("rs_dlg_round")) and history["rs_dlg_round"][-1] == rnd  # -dlg's rounds
        for name, values in history.items():
            if not values or name in ("rs_eval_round", "rs_dlg_round") or not isinstance(values[-1], (int, float)):
                continue
            evaluation = evaluated and name.startswith(("rs_test", "rs_train", "rs_val", "rs_after"))
            if name == "rs_round_time" or evaluation or (attacked and name.startswith("rs_dlg_")):
                self.writer.add_scalar(name, float(values[-1]), rnd)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
