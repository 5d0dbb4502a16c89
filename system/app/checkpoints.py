"""A run's checkpoints and ``--resume``: where they live (a folder per configuration of flags), what one
holds (the server's declared state, every random generator, the round), the checks a checkpoint must
pass before anything is loaded, and continuing from the newest usable one.

:class:`Checkpoints` is the part of :class:`~app.run.FederatedRun` that owns them; it reads the run's
``server``, ``config`` and ``results_file``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import torch

from app.options import flag_defaults
from flcore.clients.spill_files import StoreError
from flcore.state import StateError
from utils.checkpoint import (KEEP, CheckpointError, checkpoint_folder, config_differences, global_rng_state,
                              load_latest_checkpoint, other_checkpoint_folders, payload_round, rng_state_problem,
                              save_checkpoint, set_global_rng_state)
from utils.paths import display_path, portable_config
from utils.result_utils import read_results
from utils.run_identity import NON_IDENTIFYING_FLAGS


def run_checkpoint_folder(results_file: Path, config) -> Path:
    """The checkpoints of the run of ``config`` (one run's: its seed) that writes ``results_file``: under its
    results name, in a folder of its result-affecting flags."""
    return checkpoint_folder(results_file, config.flags(), flag_defaults())


class Checkpoints:
    """Saving, checking and resuming from the checkpoints of one run."""

    def checkpoint_folder(self) -> Path:
        return run_checkpoint_folder(self.results_file, self.config)

    def save_checkpoint(self, rnd: int, loop_done: bool = False) -> Path:
        """Everything needed to continue after round ``rnd``, including every random generator.

        ``loop_done``: no round follows (the last round, or -ab stopped the run); a resumed run goes
        straight to the server's ``finish``.
        """
        payload = {"config": self.config.flags(), "server": self.server.get_state(), "rng": global_rng_state(),
                   "threads": torch.get_num_threads(), "round": rnd, "loop_done": bool(loop_done)}
        path = save_checkpoint(self.checkpoint_folder(), rnd, payload)
        self.server.state_store.files.pin(rnd, KEEP)  # spilled clients are saved as the files they are in: keep those
        return path

    def checkpoint_problem(self, payload: dict) -> Optional[str]:
        """Why ``payload`` cannot continue this run, or None; checked before anything is loaded."""
        if not {"config", "server", "rng"} <= set(payload) or not isinstance(payload["config"], dict):
            return "not a checkpoint of this program (no config, server or rng entry)"
        differences = config_differences(payload["config"], self.config.flags(), flag_defaults())
        if differences:
            return "made with other flags (" + "; ".join(differences) + ")"
        rnd = payload_round(payload)
        if rnd is None:
            return "holds no valid round number (not a checkpoint of this program)"
        if rnd > self.config.global_rounds:
            return f"its round {rnd} is past -gr {self.config.global_rounds}"
        threads, loop_done = payload.get("threads"), payload.get("loop_done", False)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)) \
                or not isinstance(loop_done, bool):
            return "not a checkpoint of this program (threads or loop_done entry of the wrong kind)"
        problem = rng_state_problem(payload["rng"])
        try:
            self.server.check_state(payload["server"])
        except StateError as err:
            problem = problem or str(err)
        if problem:
            return f"does not fit this run ({problem}); it was not loaded"
        return None

    def resume(self) -> Optional[str]:
        """Continue from the newest usable checkpoint of this run's flags; returns a note for the user.

        Unusable checkpoints (no or wrong checksum, unloadable, not fitting this server) are skipped and
        named; with none usable the run starts from round 0 and says so. Refuses (``CheckpointError``)
        when the only checkpoints under this results name were made with other flags, and, keeping the
        checkpoint, when the client-state store cannot take its clients in (``--state_memory`` too small).
        """
        folder = self.checkpoint_folder()
        try:
            found = load_latest_checkpoint(folder, check=self.checkpoint_problem)
        except CheckpointError as err:
            return f"{err}; starting from round 0"
        if found is None:
            found = self._checkpoint_of_other_folders(folder)
            if found is None:
                if self._completed_before():
                    self.already_complete = True
                    return (f"the run is complete already (results in {display_path(self.results_file)}); "
                            f"nothing to resume")
                return "no checkpoint to resume from; starting from round 0"
        try:
            self.server.set_state(found.payload["server"])
            set_global_rng_state(found.payload["rng"])
        except StoreError as err:
            # Loading reads no client-state file (every one was checked, and the clients adopt them): what
            # failed is the store taking the clients in (too small a --state_memory, a full disk, a folder
            # in a file's place). The checkpoint is sound, and the only way to continue the run: keep it.
            raise CheckpointError(f"cannot resume from {display_path(found.path)}: {err}, then rerun with "
                                  f"--resume (keep the checkpoint: it passed its checks)") from None
        except (StateError, RuntimeError, ValueError, KeyError, TypeError) as err:
            # Past every check, so the server may be half loaded: no other checkpoint can be tried now.
            raise CheckpointError(f"{display_path(found.path)} passed its checks but cannot be loaded "
                                  f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); delete it "
                                  f"and rerun with --resume") from None
        self.server.current_round = found.round + 1
        self.server.state_store.files.pin(found.round, KEEP)
        self.loop_done = found.payload.get("loop_done", False)
        notes = [f"skipped {s}" for s in found.skipped]
        threads_note = self._match_checkpoint_threads(found.payload.get("threads"))
        if threads_note:
            notes.append(threads_note)
        if found.path is not None and found.path.parent != folder:  # continued in the flags' own folder
            self.unkeyed_checkpoints = found.path.parent
            notes.append(f"read {display_path(found.path)}")
        done = " (no round left)" if self.loop_done else ""
        return "; ".join(notes + [f"resumed after round {found.round}{done}"])

    def _completed_before(self) -> bool:
        """Whether the results file holds this very run, complete (the same identifying flags)."""
        try:
            arrays, attrs = read_results(self.results_file)
        except (OSError, ValueError, KeyError):
            return False
        recorded = attrs.get("config")
        if not attrs.get("complete") or not isinstance(recorded, dict):
            return False
        wanted = portable_config(self.config.flags())
        return all(recorded.get(key) == value for key, value in wanted.items() if key not in NON_IDENTIFYING_FLAGS)

    def _checkpoint_of_other_folders(self, folder: Path):
        """With no checkpoint in this run's flags' folder: one under the same results name but in a folder
        not keyed by these flags (as the layout before flag keys wrote them), if made with the same
        flags; else refuse, listing the differences, when there are checkpoints of other flags; else None."""
        differences: List[str] = []
        blocking: Optional[Path] = None
        for other in other_checkpoint_folders(folder):
            try:
                found = load_latest_checkpoint(other)
            except CheckpointError:
                continue
            config = found.payload.get("config") if isinstance(found.payload, dict) else None
            diff = (config_differences(config, self.config.flags(), flag_defaults()) if isinstance(config, dict)
                    else ["unreadable flags"])
            if not diff and self.checkpoint_problem(found.payload) is None:
                return found
            if blocking is None:
                differences, blocking = diff, other
        if blocking is not None:
            raise CheckpointError(
                f"cannot resume: the checkpoints of {self.results_file.stem} were made with other flags ("
                + "; ".join(differences) + f"); rerun with the original flags, or delete {display_path(blocking)} "
                f"(or run without --resume) to start these flags from round 0")
        return None

    def _match_checkpoint_threads(self, saved: Optional[int]) -> str:
        """Use the checkpoint's intra-op thread count, unless ``--threads`` asks for another one.

        Float sums are split across threads, so the same run under another count differs in the last bits.
        """
        current = torch.get_num_threads()
        if not saved or int(saved) == current:
            return ""
        if not self.config.threads:
            torch.set_num_threads(int(saved))
            return f"using the checkpoint's {int(saved)} intra-op threads (this machine's default is {current})"
        return (f"the checkpoint ran with {int(saved)} intra-op threads and --threads asks for {current}: "
                f"the resumed results will differ from an uninterrupted run in the last bits")
