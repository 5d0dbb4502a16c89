"""FedLAG on Flower (``flower/``): Flower's simulation engine and a real deployment on loopback.

One module fixture runs the app through the ``flwr`` command line, as a user would, on both engines at
once (2 rounds, 2 nodes: partitions 0 and 1 of the tiny 'Toy' data): a SuperLink in simulation mode
(Ray backend), and a SuperLink plus two SuperNodes on free loopback ports. Each test then checks, from
what its run wrote (the ServerApp's ``.h5`` and final global model, the nodes' model dumps), that

* the personal layers stayed on the nodes: after the last broadcast every node holds its own trained
  values of the layers chosen personal (not the server's average) and the server's aggregate of
  every other tensor;
* the recorded conflict scores are rounds x layers, with 2 uploads per round and K layers chosen;
* the Flower run is the project's own ``-algo FedLAG`` (``LayerConflictMixin``) on the same clients:
  same scores, same personal layers, same global model, same client models.

Every process is started in its own session and stopped, with all its descendants, by process id.
Flower's and Ray's files go to temporary folders (FLWR_HOME, HOME, RAY_TMPDIR); nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers import REPO, play_round, server_for  # noqa: E402
from utils.accuracy_summary import summary_from_arrays  # noqa: E402
from utils.result_utils import read_results  # noqa: E402

# The simulation engine starts a local Ray: the same worker of a parallel test run as the other Ray tests.
pytestmark = pytest.mark.xdist_group("ray")

APP = REPO / "flower"
BIN = Path(sys.executable).parent  # this interpreter's flwr, flower-superlink, flower-supernode
ROUNDS, NODES, TOP_K = 2, 2, 2
RUN_CONFIG = {"dataset": "Toy", "num-clients": 6, "model": "DNN", "learning-rate": 0.05, "seed": 0,
              "num-server-rounds": ROUNDS, "eval-gap": ROUNDS, "lag-top-k": TOP_K, "min-nodes": NODES,
              "torch-threads": 1, "lag-granularity": "tensor"}
RESULT = "Toy_FedLAG_flower_0"
TIMEOUT = 240  # seconds for one whole run; a healthy one takes a fraction of it


# ----- processes ------------------------------------------------------------------------------------------
def _children() -> Dict[int, List[int]]:
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> List[int]:
    children, out, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Processes:
    """Long-running processes of one test; :meth:`stop` ends each and its descendants by pid."""

    def __init__(self, env: dict, log_dir: Path):
        self.env, self.log_dir, self.started = env, log_dir, []

    def start(self, name: str, *argv: str, env: dict | None = None) -> subprocess.Popen:
        env = env or self.env
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=env["HOME"],
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.started.append((name, proc))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log (tail)\n" + (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                         for name, _ in self.started)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s, to every started process and every descendant seen; a pid is
        signalled only while its start time is the one recorded (never a recycled pid)."""
        known: Dict[int, int] = {}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for _, proc in self.started:
                if proc.poll() is None:  # not reaped yet, so the pid is still this process
                    for pid in [proc.pid] + _descendants(proc.pid):
                        known.setdefault(pid, _start_time(pid))
            alive = [pid for pid, start in known.items() if start is not None and _start_time(pid) == start]
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while alive and time.monotonic() < deadline:
                for _, proc in self.started:
                    proc.poll()  # reap our direct children
                alive = [pid for pid in alive if _start_time(pid) == known[pid]]
                time.sleep(0.1)
            if not alive:
                return


def _start_time(pid: int):
    """The process's start time (clock ticks after boot), or None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for_superlink(port: int, procs: Processes, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"flower-superlink exited\n{procs.logs()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"flower-superlink not healthy after {timeout} s\n{procs.logs()}")


# ----- flwr ------------------------------------------------------------------------------------------------
def flower_env(root: Path, ray_tmp: str) -> dict:
    """Environment of every Flower process: private homes, no network, this interpreter first on PATH."""
    env = dict(os.environ, FLWR_HOME=str(root / "cli-home"), HOME=str(root / "home"), RAY_TMPDIR=ray_tmp,
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_TELEMETRY_ENABLED="0", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    for key in ("PFL_REPO", "RAY_ADDRESS"):
        env.pop(key, None)
    return env


def home(env: dict, root: Path, name: str, **extra: str) -> dict:
    """``env`` with a Flower home of its own (each SuperLink and SuperNode installs the app there)."""
    (root / name).mkdir(parents=True, exist_ok=True)
    return dict(env, FLWR_HOME=str(root / name), **extra)


def add_connections(env: dict, ports: Dict[str, int]) -> None:
    """SuperLink connections in the Flower configuration ($FLWR_HOME/config.toml) of the flwr CLI."""
    Path(env["FLWR_HOME"]).mkdir(parents=True, exist_ok=True)
    text = f'[superlink]\ndefault = "{next(iter(ports))}"\n'
    for name, port in ports.items():
        text += f'\n[superlink.{name}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(text)


def config_string(values: dict) -> str:
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in values.items())


def start_run(procs: Processes, connection: str, run_config: dict, *extra: str) -> subprocess.Popen:
    """``flwr run`` the app and follow its log (``--stream``) until the run ends."""
    return procs.start(f"flwr-run-{connection}", str(BIN / "flwr"), "run", str(APP), connection, "--stream",
                       "-c", config_string(run_config), *extra)


def run_status(procs: Processes, connection: str) -> str:
    """The run's final status as ``flwr ls`` reports it, with its details."""
    env, output = procs.env, (procs.log_dir / f"flwr-run-{connection}.log").read_text(errors="replace")
    if "Successfully started run " not in output:
        return f"not started: {output[-3000:]}"
    run_id = output.split("Successfully started run ", 1)[1].split()[0]
    listing = subprocess.run([str(BIN / "flwr"), "ls", connection, "--run-id", run_id, "--format", "json"],
                             env=env, capture_output=True, text=True, timeout=60, cwd=env["HOME"])
    try:
        run = json.loads(listing.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError):
        return f"flwr ls failed: {listing.stdout}{listing.stderr}\n{output[-6000:]}"
    return run["status"] if run["status"] == "finished:completed" else (
        f"{run['status']}: {run['status-details']}\n{output[-6000:]}")


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Both engines run the app at the same time (the deployment mostly waits on Flower's 3 s polling,
    the simulation mostly on Ray's start), each for 2 rounds with 2 nodes; every process is stopped
    by pid at the end. Returns, per engine, the run's status and the folders it wrote."""
    root = tmp_path_factory.mktemp("flower")
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = flower_env(root, ray_tmp)
    Path(env["HOME"]).mkdir()
    procs = Processes(env, root)
    sim_port, dep_port, *node_ports = free_ports(2 + NODES)
    out = {engine: {"results": root / engine / "results", "dumps": root / engine / "dumps"}
           for engine in ("simulation", "deployment")}
    try:
        # Deployment (the longer run, so it starts first): one SuperLink and two SuperNodes, each a process
        # with its own Flower home. Its ServerApp finds the project through $PFL_REPO, the nodes through
        # repo-dir in their --node-config.
        dep = procs.start("superlink-deployment", str(BIN / "flower-superlink"), "--insecure",
                          "--port", str(dep_port), "--disable-runtime-dependency-installation",
                          env=home(env, root, "deployment-home", PFL_REPO=str(REPO)))
        # Simulation: a SuperLink in simulation mode; Flower's Ray backend runs the 2 virtual SuperNodes.
        sim = procs.start("superlink-simulation", str(BIN / "flower-superlink"), "--insecure", "--simulation",
                          "--port", str(sim_port), "--disable-runtime-dependency-installation",
                          env=home(env, root, "simulation-home"))
        add_connections(env, {"local-deployment": dep_port, "local-simulation": sim_port})
        common = dict(RUN_CONFIG, **{"data-dir": str(data_dir)})
        launched = {}

        wait_for_superlink(dep_port, procs, dep)
        for node, port in enumerate(node_ports):
            node_config = config_string({"partition-id": node, "num-partitions": NODES, "repo-dir": str(REPO),
                                         "data-dir": str(data_dir), "dump-dir": str(out["deployment"]["dumps"])})
            procs.start(f"supernode{node}", str(BIN / "flower-supernode"), "--insecure",
                        "--superlink", f"127.0.0.1:{dep_port}", "--port", str(port), "--node-config", node_config,
                        env=home(env, root, f"node{node}-home"))
        launched["deployment"] = start_run(procs, "local-deployment",
                                           dict(common, **{"results-dir": str(out["deployment"]["results"])}))

        wait_for_superlink(sim_port, procs, sim)
        # The simulation's ServerApp finds the project through repo-dir in the run config.
        launched["simulation"] = start_run(
            procs, "local-simulation",
            dict(common, **{"repo-dir": str(REPO), "results-dir": str(out["simulation"]["results"]),
                            "dump-dir": str(out["simulation"]["dumps"])}),
            "--federation-config", f"num-supernodes={NODES} client-resources-num-cpus=1 init-args-num-cpus=1")

        deadline = time.monotonic() + TIMEOUT
        for engine, proc in launched.items():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
                out[engine]["status"] = run_status(procs, f"local-{engine}")
            except subprocess.TimeoutExpired:
                out[engine]["status"] = f"no result after {TIMEOUT} s"
    finally:
        logs = procs.logs()
        procs.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for engine in out:
        out[engine]["logs"] = logs
    return out


# ----- what the run must show ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """``main.py -algo FedLAG -nc 2 -gr 1`` (rounds 0 and 1), then the broadcast the nodes evaluate after."""
    server = server_for(data_dir, tmp_path_factory.mktemp("reference"), "-algo", "FedLAG", "-nc", str(NODES),
                        "-gr", str(ROUNDS - 1), "--lag_top_k", str(TOP_K))
    for _ in range(ROUNDS):
        play_round(server)
    server.send_models()
    return {"scores": [s.tolist() for s in server.lag_selector.history["scores"]],
            "personal": server.lag_personal_names(),
            "global": {n: t.detach().numpy().copy() for n, t in server.global_model.state_dict().items()},
            "clients": [{n: t.detach().numpy().copy() for n, t in c.model.state_dict().items()}
                        for c in server.clients]}


def check_run(results: Path, dumps: Path, reference: dict) -> None:
    arrays, attrs = read_results(results / f"{RESULT}.h5")
    names = [str(n) for n in arrays["lag_layer_names"]]
    scores, personal = arrays["lag_conflict_scores"], arrays["lag_personal"]
    assert scores.shape == personal.shape == (ROUNDS, len(names))
    assert ((scores >= 0) & (scores <= NODES * (NODES - 1) // 2)).all()
    assert arrays["lag_num_uploads"].tolist() == [NODES] * ROUNDS
    assert (personal.sum(axis=1) <= TOP_K).all()  # layers without a conflict are never chosen
    assert arrays["rs_eval_round"].tolist() == [ROUNDS] and 0 <= arrays["rs_test_acc"][0] <= 1
    assert attrs["engine"] == "flower" and attrs["algorithm"] == "FedLAG"
    assert attrs["summary"] == summary_from_arrays(arrays, 10).as_attrs()   # as main.py's runs (default k)
    assert attrs["summary"]["clients"] == NODES                               # both nodes evaluated

    final = dict(np.load(results / f"{RESULT}.global.npz"))
    kept = [name for name, chosen in zip(names, personal[-1]) if chosen]
    for node in range(NODES):
        trained = np.load(dumps / f"node{node}_round{ROUNDS}_train.npz")
        held = dict(np.load(dumps / f"node{node}_round{ROUNDS}_evaluate.npz"))
        assert set(held) == set(final)
        for name in final:
            expected = trained[name] if name in kept else final[name]
            assert np.array_equal(held[name], expected), f"node {node}: {name}"
        assert any(not np.array_equal(held[name], final[name]) for name in kept), "personal = average?"

    # The same run as the project's own FedLAG (LayerConflictMixin) on the same two clients.
    assert scores.tolist() == reference["scores"]
    assert kept == reference["personal"]
    for name, value in reference["global"].items():
        np.testing.assert_allclose(final[name], value, rtol=0, atol=1e-6, err_msg=name)
    for node in range(NODES):
        held = np.load(dumps / f"node{node}_round{ROUNDS}_evaluate.npz")
        for name, value in reference["clients"][node].items():
            np.testing.assert_allclose(held[name], value, rtol=0, atol=1e-6, err_msg=f"node {node}: {name}")


# ----- the two engines ------------------------------------------------------------------------------------------
def _check_engine(run: dict, reference: dict) -> None:
    assert run["status"] == "finished:completed", f"{run['status']}\n{run['logs']}"
    check_run(run["results"], run["dumps"], reference)


def test_simulation_keeps_personal_layers_on_the_nodes(runs, reference):
    """Flower's simulation engine (Ray backend), started by ``flwr run`` against a simulation SuperLink."""
    _check_engine(runs["simulation"], reference)


def test_deployment_keeps_personal_layers_on_the_nodes(runs, reference):
    """Flower's deployment engine: a real SuperLink and two SuperNodes talking over loopback HTTP."""
    _check_engine(runs["deployment"], reference)


# ----- the strategy alone (no processes) ----------------------------------------------------------------------
class _Reply:
    """Just what the strategy reads from a Flower reply message."""

    def __init__(self, content=None, error: str = "", node: int = 0):
        self.content, self.error = content, SimpleNamespace(reason=error)
        self.metadata = SimpleNamespace(src_node_id=node)

    def has_error(self) -> bool:
        return bool(self.error.reason)


def _train_reply(partition: int, examples: int, update: Dict[str, list], state: Dict[str, list]) -> _Reply:
    import torch
    from flwr.app import MetricRecord, RecordDict
    from pfl_flower import task
    return _Reply(RecordDict({
        "arrays": task.to_record({k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()}),
        "update": task.to_record({k: torch.tensor(v, dtype=torch.float32) for k, v in update.items()}),
        "metrics": MetricRecord({"num-examples": examples, "partition-id": partition})}))


def test_strategy_refuses_group_sharing(monkeypatch):
    """The app keeps every personal layer on its own node: --lag_share groups is refused, not ignored."""
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag.selector import LagSettings
    from pfl_flower.strategy import FedLagStrategy
    with pytest.raises(ValueError, match="--lag_share own"):
        FedLagStrategy(LagSettings(share="groups"), ["fc.weight", "fc.bias"], num_rounds=1)


def test_strategy_scores_chooses_and_averages(monkeypatch):
    """Per-layer conflict counts from the replies, top-K with ties to the earlier layer, the warm-up
    schedule, the sample-weighted average, and a round where every node failed."""
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag.selector import LagSettings
    from pfl_flower.strategy import FedLagStrategy

    names = ["a.weight", "a.bias", "b.weight"]
    # a.weight: pairs (0,1) and (1,2) point apart; a.bias: none; b.weight: (0,2) and (1,2).
    updates = [{"a.weight": [1.0, 0.0], "a.bias": [1.0], "b.weight": [1.0]},
               {"a.weight": [-1.0, 0.0], "a.bias": [2.0], "b.weight": [1.0]},
               {"a.weight": [1.0, 1.0], "a.bias": [1.0], "b.weight": [-1.0]}]
    states = [{"a.weight": [float(i), 0], "a.bias": [1.0], "b.weight": [2.0 * i]} for i in range(3)]
    counts = [1, 2, 1]

    def replies(order=(2, 0, 1)):
        return [_train_reply(i, counts[i], updates[i], states[i]) for i in order]

    def sent(strategy):  # what configure_train would have sent: the replies are checked against it
        import torch
        from pfl_flower import task
        strategy.expect_replies_to(task.to_record({n: torch.tensor(v) for n, v in states[0].items()}))
        return strategy

    strategy = sent(FedLagStrategy(LagSettings(top_k=1, schedule="every_round", granularity="tensor"), names,
                                   num_rounds=2))
    arrays, _ = strategy.aggregate_train(1, replies())
    assert strategy.selector.history["scores"][0].tolist() == [2, 0, 2]
    assert strategy.personal_names() == ["a.weight"]  # tie with b.weight: the earlier layer
    average = {k: v.numpy() for k, v in arrays.items()}
    assert np.allclose(average["a.weight"], [1.0, 0]) and np.allclose(average["b.weight"], [2.0])

    strategy.aggregate_train(2, replies()[:1])  # one upload: nothing to compare, choice kept
    assert strategy.selector.history["scores"][1].tolist() == [0, 0, 0] and strategy.personal_names() == ["a.weight"]

    warm = sent(FedLagStrategy(LagSettings(top_k=2, schedule="warmup", warmup=2, granularity="tensor"), names,
                               num_rounds=3))
    warm.aggregate_train(1, replies())
    assert warm.personal_names() == []  # still warming up
    warm.aggregate_train(2, replies())
    assert warm.personal_names() == ["a.weight", "b.weight"]
    updates[0]["a.bias"] = [-1.0]
    warm.aggregate_train(3, replies())
    assert warm.selector.history["scores"][2].tolist() == [2, 2, 2] and warm.personal_names() == ["a.weight", "b.weight"]
    assert warm.result_arrays()["lag_personal"].tolist() == [[False] * 3, [True, False, True], [True, False, True]]

    with pytest.raises(RuntimeError, match="every node failed.*boom"):
        strategy.aggregate_train(3, [_Reply(error="boom", node=7)])


@pytest.mark.parametrize("defect, reason", [
    ({"state": {"a.weight": [float("nan"), 0.0]}}, "a.weight holds a NaN or infinite value"),
    ({"state": {"a.weight": [1e30, 0.0]}}, "beyond"),
    ({"state": {"a.weight": [1.0, 0.0, 0.0]}}, "a.weight has shape (3,)"),
    ({"state": {"c.weight": [1.0]}}, "unexpected c.weight"),
    ({"update": {"b.weight": [float("inf")]}}, "b.weight holds a NaN or infinite value"),
    ({"examples": 10 ** 9}, "above the 5 training samples"),
    ({"examples": -2}, "not a whole number >= 1"),
], ids=["nan", "1e30", "shape", "name", "update-inf", "examples-1e9", "examples-negative"])
def test_a_poisoned_reply_is_a_failure_and_never_averaged(monkeypatch, defect, reason):
    """Two replies, one of them bad in one way: the average is the good one's alone, the bad one is that
    node's failure for the round (the run is not complete), and the next round goes on."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flcore.lag.selector import LagSettings
    from pfl_flower import task
    from pfl_flower.strategy import FedLagStrategy

    names = ["a.weight", "b.weight"]
    good = {"a.weight": [1.0, 2.0], "b.weight": [3.0]}
    strategy = FedLagStrategy(LagSettings(top_k=1), names, num_rounds=3, train_samples=[5, 5])
    strategy.expect_replies_to(task.to_record({"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}))
    bad_state = dict(good, **defect.get("state", {}))
    bad_update = dict(good, **defect.get("update", {}))
    replies = [_train_reply(0, 4, good, good), _train_reply(1, defect.get("examples", 4), bad_update, bad_state)]
    arrays, _ = strategy.aggregate_train(1, replies)
    average = task.from_record(arrays)
    assert torch.equal(average["a.weight"], torch.tensor([1.0, 2.0]))
    assert torch.equal(average["b.weight"], torch.tensor([3.0]))
    status = strategy.run_status()
    assert not status["complete"] and [(f["round"], f["phase"], f["partition"]) for f in status["failures"]] == \
        [(1, "train", 1)]
    assert reason in status["failures"][0]["reason"] and strategy.history["failed_train"] == [1]
    with pytest.raises(RuntimeError, match="no reply could be averaged"):
        strategy.aggregate_train(2, replies[1:])


# ----- run config, node checks, failed nodes (no processes) -------------------------------------------------
def _context(data_dir, tmp_path, node=None, **run):
    from flwr.app import Context, RecordDict
    config = {"dataset": "Toy", "num-clients": 6, "model": "DNN", "data-dir": str(data_dir),
              "results-dir": str(tmp_path), "repo-dir": str(REPO), **run}
    return Context(run_id=1, node_id=1, node_config=node or {}, state=RecordDict(), run_config=config)


@pytest.mark.parametrize("key, value, expected", [
    ("lag-top-k", -1, "run config: lag-top-k must be >= 0, got -1"),
    ("lag-schedule", "weekly", "run config: argument lag-schedule: invalid choice: 'weekly'"),
    ("learning-rate", "fast", "run config: argument learning-rate: invalid float value: 'fast'"),
    ("num-server-rounds", 0, "run config: num-server-rounds must be an integer >= 1, got 0"),
    ("fraction-train", 1.5, "run config: fraction-train must be a number in [0, 1], got 1.5"),
])
def test_an_invalid_run_config_value_fails_the_server_app_naming_the_key(monkeypatch, data_dir, tmp_path,
                                                                         key, value, expected):
    """The ServerApp raises the project's ConfigError (an Exception: Flower records the run as failed,
    with this message) naming the run-config key, never argparse's SystemExit naming a main.py flag."""
    monkeypatch.syspath_prepend(str(APP))
    from utils.errors import ConfigError
    from pfl_flower import server_app

    with pytest.raises(ConfigError) as refused:
        server_app.main(None, _context(data_dir, tmp_path, **{key: value}))  # fails before using the grid
    assert str(refused.value).startswith(expected), str(refused.value)
    assert "--" not in str(refused.value).split(";")[0]  # no main.py flag spelling
    assert not list(tmp_path.glob("*.h5"))


def test_a_node_outside_num_clients_fails_clearly(monkeypatch, data_dir, tmp_path):
    """Toy holds 6 clients; with num-clients 2 only partitions 0 and 1 belong to the run."""
    monkeypatch.syspath_prepend(str(APP))
    from pfl_flower import task

    assert task.build_client(_context(data_dir, tmp_path, {"partition-id": 1}, **{"num-clients": 2})).id == 1
    for bad in (2, 5, -1):
        with pytest.raises(task.SetupError, match=rf"partition-id {bad} is not a client of the run: num-clients "
                                                  r"is 2, so partition-id must be an integer in 0\.\.1"):
            task.build_client(_context(data_dir, tmp_path, {"partition-id": bad}, **{"num-clients": 2}))


class _Grid:
    """Just what FedAvg's sampling reads from Flower's Grid: the connected node ids."""

    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


def _evaluate_reply(node: int, partition: int) -> _Reply:
    from flwr.app import MetricRecord, RecordDict
    return _Reply(RecordDict({"metrics": MetricRecord({
        "num-examples": 4, "correct": 2, "auc": 0.5, "train-loss-sum": 1.0, "train-samples": 2,
        "partition-id": partition})}), node=node)


def test_failed_and_missing_nodes_are_recorded_and_the_run_is_not_complete(monkeypatch):
    """Four nodes are sampled. Evaluation of round 2: node 30 replies with an error and node 40 never
    replies; both are listed with their partitions (known from round 1), counted, and the run is not
    complete. Training of round 3: every node fails: the run stops, and the failures are recorded too."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flwr.app import ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity
    from flcore.lag.mixin import LagSettings
    from pfl_flower import task
    from pfl_flower.strategy import FedLagStrategy

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    strategy = FedLagStrategy(LagSettings(top_k=1), ["a.weight", "b.weight"], num_rounds=3, min_available_nodes=1)
    arrays = task.to_record({"a.weight": torch.zeros(1), "b.weight": torch.zeros(1)})
    grid, nodes = _Grid([10, 20, 30, 40]), [10, 20, 30, 40]

    sent = strategy.configure_evaluate(1, arrays, ConfigRecord(), grid)
    assert sorted(m.metadata.dst_node_id for m in sent) == nodes
    strategy.aggregate_evaluate(1, [_evaluate_reply(n, p) for p, n in enumerate(nodes)])
    assert strategy.run_status()["complete"] and strategy.run_status()["failures"] == []

    strategy.configure_evaluate(2, arrays, ConfigRecord(), grid)
    strategy.aggregate_evaluate(2, [_evaluate_reply(10, 0), _Reply(error="CUDA out of memory", node=30),
                                    _evaluate_reply(20, 1)])
    status = strategy.run_status()
    assert status["complete"] is False
    assert [(f["round"], f["phase"], f["node"], f["partition"]) for f in status["failures"]] == \
        [(2, "evaluate", 30, 2), (2, "evaluate", 40, 3)]
    assert "CUDA out of memory" in status["failures"][0]["reason"] and "no reply" in status["failures"][1]["reason"]
    assert strategy.result_arrays()["rs_failed_evaluate_nodes"].tolist() == [0, 2]
    assert strategy.history["clients"] == [[0, 1, 2, 3], [0, 1]]

    strategy.configure_train(3, arrays, ConfigRecord(), grid)
    with pytest.raises(RuntimeError, match="every node failed; first error: node 10: disk full"):
        strategy.aggregate_train(3, [_Reply(error="disk full", node=n) for n in (10, 20)])
    assert strategy.result_arrays()["rs_failed_nodes"].tolist() == [4]
    assert [(f["phase"], f["node"]) for f in strategy.run_status()["failures"][2:]] == \
        [("train", 10), ("train", 20), ("train", 30), ("train", 40)]
