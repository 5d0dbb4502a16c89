"""A run stopped by a signal keeps its rounds: Ctrl-C (SIGINT), SIGTERM (``kill``, a scheduler, a batch's
``--timeout``) and SIGHUP leave the rounds done so far in the ``.h5``, marked incomplete, and exit with the
status a shell expects of that signal."""
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from app.stop_signals import StopRequested, exit_status, signal_of, stop_signals_deferred, stop_signals_raise
from utils.result_utils import read_results, result_path
from helpers import cli, main_command

ROUNDS_BEFORE_THE_SIGNAL = 3
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_stop_signals() -> None:
    """In the child before it starts: the three signals at their defaults, as in a terminal, whatever the tests
    were started from (a shell's background job ignores SIGINT, and a run keeps a signal ignored)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def run_until_round(data_dir, results, *extra, start_after_note=False):
    """main.py on the test data for many rounds, returned live once its output shows
    ``ROUNDS_BEFORE_THE_SIGNAL`` rounds (after the first round it prints, or, with ``start_after_note``,
    after the round its resume note names)."""
    cmd = main_command(*cli(data_dir, results, "-algo", "FedAvg", "-gr", "100000", *extra))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), preexec_fn=default_stop_signals)
    target = None if start_after_note else ROUNDS_BEFORE_THE_SIGNAL
    for line in proc.stdout:
        if target is None and "resumed after round " in line:
            target = int(line.split("resumed after round ")[1].split()[0]) + ROUNDS_BEFORE_THE_SIGNAL
        shown = re.match(r"round +(\d+)/", line)
        if target is not None and shown and int(shown.group(1)) >= target:
            return proc
    raise AssertionError(f"the run ended before round {ROUNDS_BEFORE_THE_SIGNAL}: {proc.stderr.read()}")


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_run_stopped_by_a_signal_keeps_its_rounds_marked_incomplete(signum, data_dir, tmp_path):
    proc = run_until_round(data_dir, tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    h5 = result_path(tmp_path, "Toy", "FedAvg", "test", 0)
    arrays, attrs = read_results(h5)
    assert not attrs["complete"]
    # Every round the output showed is in the file (the one under way when the signal came may be too).
    rounds = arrays["rs_eval_round"]
    assert list(rounds[:ROUNDS_BEFORE_THE_SIGNAL + 1]) == list(range(ROUNDS_BEFORE_THE_SIGNAL + 1))
    assert len(arrays["rs_test_acc"]) == len(rounds)
    assert attrs["summary"]["best"] == pytest.approx(float(np.max(arrays["rs_test_acc"])))
    assert h5.with_suffix(".csv").is_file()
    assert not h5.with_suffix(".lock").exists()
    last = err.strip().splitlines()[-1]
    assert f"stopped by {signal.Signals(signum).name}" in last and f"Results so far kept in {h5}" in last


def test_a_stopped_run_with_checkpoints_keeps_them_and_continues_from_them(data_dir, tmp_path):
    flags = ("--checkpoint_every", "1")
    proc = run_until_round(data_dir, tmp_path, *flags)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "rerun with --resume to continue" in err
    resumed = run_until_round(data_dir, tmp_path, *flags, "--resume", start_after_note=True)
    resumed.send_signal(signal.SIGTERM)
    resumed.communicate(timeout=60)
    arrays, attrs = read_results(result_path(tmp_path, "Toy", "FedAvg", "test", 0))
    assert not attrs["complete"]
    rounds = list(arrays["rs_eval_round"])
    # The first run's checkpoint of round k >= 2 (round 3 was shown, so round 2's was written), then the
    # resumed run's rounds k+1 .. at least k+3: one series without a gap or a repeat.
    assert rounds == list(range(len(rounds))) and len(rounds) >= ROUNDS_BEFORE_THE_SIGNAL + 3


def test_a_signal_the_process_ignores_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_stop_signals_raise_then_give_the_old_handlers_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopRequested) as caught:
        with stop_signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run here, not after the block
            for _ in range(1000):
                pass
    assert signal_of(caught.value) == signal.SIGTERM and exit_status(caught.value) == 143
    assert exit_status(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_deferred_signal_does_not_interrupt_the_block():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, however tests started
    try:
        done = False
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            done = True
        assert done
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler or sys.platform == "win32"
    finally:
        signal.signal(signal.SIGINT, previous)
