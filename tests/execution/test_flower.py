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

from helpers import REPO, in_use, play_round, server_for  # noqa: E402
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
            "clients": [{n: t.detach().numpy().copy() for n, t in in_use(c).model.state_dict().items()}
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


def _train_reply(partition, examples, update: Dict[str, list], state: Dict[str, list], node: int = 0) -> _Reply:
    import torch
    from flwr.app import MetricRecord, RecordDict
    from pfl_flower import task
    return _Reply(RecordDict({
        "arrays": task.to_record({k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()}),
        "update": task.to_record({k: torch.tensor(v, dtype=torch.float32) for k, v in update.items()}),
        "metrics": MetricRecord({"num-examples": examples, "partition-id": partition})}), node=node)


def _strategy(settings, names, num_rounds: int, partitions: int = 4, train: int = 5, test: int = 4, **kwargs):
    """A FedLagStrategy over ``partitions`` partitions of ``train`` training and ``test`` test samples each."""
    from pfl_flower.strategy import FedLagStrategy
    return FedLagStrategy(settings, names, num_rounds, train_samples=[train] * partitions,
                          test_samples=[test] * partitions, **kwargs)


def test_strategy_shares_a_personal_layer_within_groups_through_each_nodes_payload(monkeypatch):
    """--lag_share groups: five partitions whose updates of b agree in pairs {0, 1} and {2, 3} (and 4
    alone). After MIN_UPLOADS rounds the groups stand, and each member's next message is its payload: the
    arrays carry its group's model of b (the members' last trained copies, weighted by their samples, by
    hand), ``lag-group`` names it, and the two members of a group get one message content; partition 4
    gets FedAvg's own message."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flwr.app import ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity
    from flcore.lag.groups import MIN_UPLOADS
    from flcore.lag.selector import LagSettings
    from pfl_flower import task

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    settings = LagSettings(top_k=1, granularity="tensor", share="groups")
    strategy = _strategy(settings, ["a.weight", "b.weight"], num_rounds=MIN_UPLOADS + 1, partitions=5, train=8,
                         min_available_nodes=1)
    arrays = task.to_record({"a.weight": torch.zeros(1), "b.weight": torch.zeros(2)})
    grid = _Grid([10, 11, 12, 13, 14])  # node 10 + p holds partition p
    pulls = [[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]
    counts = [2, 6, 4, 4, 8]
    for rnd in range(1, MIN_UPLOADS + 1):
        strategy.configure_train(rnd, arrays, ConfigRecord(), grid)
        replies = [_train_reply(p, counts[p], {"a.weight": [1.0], "b.weight": pulls[p]},
                                {"a.weight": [0.5], "b.weight": [10.0 * p + rnd, -p]}, node=10 + p) for p in range(5)]
        strategy.aggregate_train(rnd, replies)
    assert strategy.personal_names() == ["b.weight"]
    assert strategy.result_arrays()["lag_groups"][-1].tolist() == [[-1] * 5, [0, 0, 2, 2, 4]]

    for messages in (strategy.configure_evaluate(MIN_UPLOADS + 1, arrays, ConfigRecord(), grid),
                     strategy.configure_train(MIN_UPLOADS + 1, arrays, ConfigRecord(), grid)):
        by_node = {m.metadata.dst_node_id: m.content for m in messages}
        assert by_node[10] is by_node[11] and by_node[12] is by_node[13] and by_node[10] is not by_node[12]
        last = MIN_UPLOADS
        for (i, j) in ((0, 1), (2, 3)):
            content = by_node[10 + i]
            weight = counts[i] / (counts[i] + counts[j])
            expected = [weight * (10.0 * i + last) + (1 - weight) * (10.0 * j + last), weight * -i + (1 - weight) * -j]
            received = task.from_record(content["arrays"])
            assert torch.allclose(received["b.weight"], torch.tensor(expected), rtol=0, atol=1e-6)
            assert torch.equal(received["a.weight"], torch.zeros(1))  # the broadcast, as for every node
            assert content["config"]["lag-group"] == "b.weight" and content["config"]["lag-personal"] == "b.weight"
        alone = by_node[14]
        assert "lag-group" not in alone["config"] and torch.equal(task.from_record(alone["arrays"])["b.weight"],
                                                                  torch.zeros(2))


def test_strategy_scores_chooses_and_averages(monkeypatch):
    """Per-layer conflict counts from the replies, top-K with ties to the earlier layer, the warm-up
    schedule, the sample-weighted average, and a round where every node failed."""
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag.selector import LagSettings

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

    strategy = sent(_strategy(LagSettings(top_k=1, schedule="every_round", granularity="tensor"), names,
                              num_rounds=2))
    arrays, _ = strategy.aggregate_train(1, replies())
    assert strategy.selector.history["scores"][0].tolist() == [2, 0, 2]
    assert strategy.personal_names() == ["a.weight"]  # tie with b.weight: the earlier layer
    average = {k: v.numpy() for k, v in arrays.items()}
    assert np.allclose(average["a.weight"], [1.0, 0]) and np.allclose(average["b.weight"], [2.0])

    strategy.aggregate_train(2, replies()[:1])  # one upload: nothing to compare, choice kept
    assert strategy.selector.history["scores"][1].tolist() == [0, 0, 0] and strategy.personal_names() == ["a.weight"]

    warm = sent(_strategy(LagSettings(top_k=2, schedule="warmup", warmup=2, granularity="tensor"), names,
                          num_rounds=3))
    warm.aggregate_train(1, replies())
    assert warm.personal_names() == []  # still warming up
    warm.aggregate_train(2, replies())
    assert warm.personal_names() == ["a.weight", "b.weight"]
    updates[0]["a.bias"] = [-1.0]
    warm.aggregate_train(3, replies())
    assert warm.selector.history["scores"][2].tolist() == [2, 2, 2] and warm.personal_names() == ["a.weight", "b.weight"]
    assert warm.result_arrays()["lag_personal"].tolist() == [[False] * 3, [True, False, True], [True, False, True]]

    with pytest.raises(RuntimeError, match="no reply could be averaged; first failure: node 7.*boom"):
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

    names = ["a.weight", "b.weight"]
    good = {"a.weight": [1.0, 2.0], "b.weight": [3.0]}
    strategy = _strategy(LagSettings(top_k=1), names, num_rounds=3, partitions=2)
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


def _evaluate_reply(node: int, partition: int, **changes) -> _Reply:
    """An evaluation reply; ``changes`` replace its metrics (with ``_`` for ``-``; None leaves one out, and
    ``metrics=None`` the whole record)."""
    from flwr.app import MetricRecord, RecordDict
    metrics = {"num-examples": 4, "correct": 2, "auc": 0.5, "train-loss-sum": 1.0, "train-samples": 2,
               "partition-id": partition}
    for key, value in changes.items():
        metrics[key.replace("_", "-")] = value
    metrics = {k: v for k, v in metrics.items() if v is not None and k != "metrics"}
    return _Reply(RecordDict({} if "metrics" in changes else {"metrics": MetricRecord(metrics)}), node=node)


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

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    strategy = _strategy(LagSettings(top_k=1), ["a.weight", "b.weight"], num_rounds=3, min_available_nodes=1)
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
    with pytest.raises(RuntimeError, match=r"no reply could be averaged; first failure: node 10 \(partition 0\): "
                                           "disk full"):
        strategy.aggregate_train(3, [_Reply(error="disk full", node=n) for n in (10, 20)])
    assert strategy.result_arrays()["rs_failed_nodes"].tolist() == [4]
    assert [(f["phase"], f["node"]) for f in strategy.run_status()["failures"][2:]] == \
        [("train", 10), ("train", 20), ("train", 30), ("train", 40)]


# ----- the app in one process: BatchNorm buffers, poisoned updates --------------------------------------------
class _LocalGrid(_Grid):
    """Flower's Grid for the app's own ClientApp functions, called in this process: one Context per node
    (its ``context.state`` is the node's memory across rounds, as on a SuperNode)."""

    def __init__(self, contexts):
        super().__init__(list(contexts))
        self.contexts = contexts

    def send_and_receive(self, messages, timeout=None):
        from pfl_flower import client_app
        handlers = {"train": client_app.train, "evaluate": client_app.evaluate}
        return [handlers[m.metadata.message_type.partition(".")[0]](m, self.contexts[m.metadata.dst_node_id])
                for m in messages]


def test_a_batchnorm_model_trains_on_flower_as_the_project_runs_it(monkeypatch, data_dir, tmp_path):
    """CNN-BN holds buffers (BatchNorm's running statistics) besides its parameters: every node's trained
    arrays carry them and its update does not (it is theta_after - theta_start of the parameters), and
    both are accepted. Two rounds, two nodes: the same scores, personal layers, global model and client
    models as ``main.py -algo FedLAG -m CNN-BN`` on the same clients, and the run is complete."""
    monkeypatch.syspath_prepend(str(APP))
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    from pfl_flower import server_app

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    flags = {"dataset": "Toy3", "num-clients": NODES, "model": "CNN-BN", "learning-rate": 0.05,
             "lag-granularity": "tensor", "lag-top-k": 1}
    run = dict(flags, **{"num-server-rounds": ROUNDS, "min-nodes": NODES, "data-dir": str(data_dir),
                         "results-dir": str(tmp_path / "results"), "dump-dir": str(tmp_path / "dumps"),
                         "repo-dir": str(REPO)})
    nodes = {10 + p: Context(run_id=1, node_id=10 + p, node_config={"partition-id": p}, state=RecordDict(),
                             run_config=run) for p in range(NODES)}
    server_app.main(_LocalGrid(nodes), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                               run_config=run))

    arrays, attrs = read_results(tmp_path / "results" / "Toy3_FedLAG_flower_0.h5")
    assert attrs["complete"] and attrs["failures"] == []
    assert arrays["rs_failed_nodes"].tolist() == [0] * ROUNDS
    assert arrays["lag_num_uploads"].tolist() == [NODES] * ROUNDS
    final = dict(np.load(tmp_path / "results" / "Toy3_FedLAG_flower_0.global.npz"))
    assert any(name.endswith("running_mean") for name in final)

    server = server_for(data_dir, tmp_path / "reference", "-algo", "FedLAG", "-data", "Toy3", "-nc", str(NODES),
                        "-m", "CNN-BN", "-gr", str(ROUNDS - 1), "--lag_top_k", "1")
    for _ in range(ROUNDS):
        play_round(server)
    server.send_models()
    assert arrays["lag_conflict_scores"].tolist() == [s.tolist() for s in server.lag_selector.history["scores"]]
    names = [str(n) for n in arrays["lag_layer_names"]]
    assert [n for n, chosen in zip(names, arrays["lag_personal"][-1]) if chosen] == server.lag_personal_names()
    for name, value in server.global_model.state_dict().items():
        np.testing.assert_allclose(final[name], value.numpy(), rtol=0, atol=1e-6, err_msg=name)
    for node, client in enumerate(server.clients):
        held = np.load(tmp_path / "dumps" / f"node{node}_round{ROUNDS}_evaluate.npz")
        for name, value in in_use(client).model.state_dict().items():
            np.testing.assert_allclose(held[name], value.numpy(), rtol=0, atol=1e-6, err_msg=f"node {node}: {name}")


def test_group_sharing_on_flower_is_the_projects_own(monkeypatch, digits_groups_dir, tmp_path):
    """--lag_share groups on the quickstart's concept shift (8 nodes, client i in label group i % 4), four
    rounds, in one process: groups form after the third round and each member then receives its group's
    model of the head with its messages. The groups, the personal layers and every node's model after the
    last round are those of ``main.py -algo FedLAG --lag_share groups`` on the same clients."""
    monkeypatch.syspath_prepend(str(APP))
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    from pfl_flower import server_app

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    nodes, rounds = 8, 4
    run = {"dataset": "Digits-iid-lg4", "num-clients": nodes, "model": "DNN", "learning-rate": 0.05,
           "lag-share": "groups", "num-server-rounds": rounds, "eval-gap": rounds, "min-nodes": nodes,
           "data-dir": str(digits_groups_dir), "results-dir": str(tmp_path / "results"),
           "dump-dir": str(tmp_path / "dumps"), "repo-dir": str(REPO)}
    contexts = {10 + p: Context(run_id=1, node_id=10 + p, node_config={"partition-id": p}, state=RecordDict(),
                                run_config=run) for p in range(nodes)}
    server_app.main(_LocalGrid(contexts), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                  run_config=run))
    arrays, attrs = read_results(tmp_path / "results" / "Digits-iid-lg4_FedLAG_flower_0.h5")
    assert attrs["complete"] and attrs["config"]["lag_share"] == "groups"

    server = server_for(digits_groups_dir, tmp_path / "reference", "-algo", "FedLAG", "-data", "Digits-iid-lg4",
                        "-nc", str(nodes), "-gr", str(rounds - 1), "--lag_granularity", "module",
                        "--lag_share", "groups")
    for _ in range(rounds):
        play_round(server)
    server.send_models()
    groups = server.lag_results()["lag_groups"]
    assert arrays["lag_groups"].tolist() == groups.tolist()
    last = groups[-1, server.lag_personal[0]].tolist()
    assert len(set(last)) < nodes, "no group formed: nothing was shared"
    names = [str(n) for n in arrays["lag_layer_names"]]
    assert [n for n, chosen in zip(names, arrays["lag_personal"][-1]) if chosen] == \
        [layer.name for layer in (server.lag_layers[i] for i in server.lag_personal)]
    for node, client in enumerate(server.clients):
        held = np.load(tmp_path / "dumps" / f"node{node}_round{rounds}_evaluate.npz")
        for name, value in in_use(client).model.state_dict().items():
            np.testing.assert_allclose(held[name], value.numpy(), rtol=0, atol=1e-6, err_msg=f"node {node}: {name}")
    head = server.lag_personal_names()[0]
    members = [i for i, g in enumerate(last) if last.count(g) > 1]
    first = np.load(tmp_path / "dumps" / f"node{members[0]}_round{rounds}_evaluate.npz")[head]
    same_group = [i for i in members if last[i] == last[members[0]]]
    for i in same_group[1:]:  # one group's members hold one model of the head
        assert np.array_equal(np.load(tmp_path / "dumps" / f"node{i}_round{rounds}_evaluate.npz")[head], first)


def test_an_update_beyond_the_models_scale_is_a_failure(monkeypatch):
    """The update is scored as the node sends it: one of 1e30 (its trained arrays sane) would overflow the
    squares of the conflict score and hide the layer's conflict. It is held to the arrays' bound: that
    node's failure for the round, left out of the scores and of the average."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flcore.lag.selector import LagSettings
    from pfl_flower import task

    state = {"a.weight": [1.0, 2.0], "b.weight": [3.0]}
    updates = [{"a.weight": [1.0, 0.0], "b.weight": [1.0]}, {"a.weight": [-1.0, 0.0], "b.weight": [1.0]},
               {"a.weight": [1e30, 0.0], "b.weight": [-1.0]}]
    strategy = _strategy(LagSettings(top_k=1, schedule="every_round"), ["a.weight", "b.weight"], num_rounds=2)
    strategy.expect_replies_to(task.to_record({"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}))
    arrays, metrics = strategy.aggregate_train(1, [_train_reply(p, 4, u, state) for p, u in enumerate(updates)])
    assert metrics["num-uploads"] == 2
    assert strategy.selector.history["scores"][0].tolist() == [1, 0]  # partitions 0 and 1 alone: a.weight apart
    assert strategy.personal_names() == ["a.weight"]
    assert [(f["partition"], f["phase"]) for f in strategy.failures] == [(2, "train")]
    assert "a.weight holds 1e+30, beyond" in strategy.failures[0]["reason"]
    assert torch.equal(task.from_record(arrays)["a.weight"], torch.tensor([1.0, 2.0]))


# ----- every reply checked at the edge: partitions, evaluation replies, the dataset's bounds ------------------
def test_a_reply_from_an_unknown_or_repeated_partition_is_a_failure(monkeypatch):
    """Partitions 0-2 reply honestly. Nodes 13 and 14 claim partitions -1 and 99 (the run has 0..3), each
    with all-50s weighed by 10^9 samples; nodes 15 and 16 both claim partition 3 with all-50s; node 17
    claims 1.5, node 18 no partition and node 19 sends no metrics. Each is its node's failure for the round,
    named; the average is the honest replies' alone, as computed by hand, whatever the arrival order (a
    repeated partition is never used: keeping the first to arrive would let the faster node decide); the
    run is not complete and the next round goes on."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flcore.lag.selector import LagSettings
    from pfl_flower import task

    strategy = _strategy(LagSettings(top_k=1, schedule="every_round"), ["a.weight", "b.weight"], num_rounds=3)
    strategy.expect_replies_to(task.to_record({"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}))
    step, fifty = {"a.weight": [1.0, 0.0], "b.weight": [1.0]}, {"a.weight": [50.0, 50.0], "b.weight": [50.0]}

    def replies():
        honest = [_train_reply(p, n, step, {"a.weight": [v, -v], "b.weight": [2 * v]}, node=10 + p)
                  for p, n, v in ((0, 1, 1.0), (1, 3, 2.0), (2, 4, 4.0))]
        liars = [_train_reply(p, n, fifty, fifty, node=node)
                 for node, p, n in ((13, -1, 10 ** 9), (14, 99, 10 ** 9), (15, 3, 5), (16, 3, 5), (17, 1.5, 1),
                                    (18, 0, 1), (19, 0, 1))]
        del liars[5].content["metrics"]["partition-id"]
        del liars[6].content["metrics"]
        return liars[:4] + honest[:2] + liars[4:] + honest[2:]

    expected = {13: (-1, "its partition-id -1 is not a client of the run (0..3)"),
                14: (-1, "its partition-id 99 is not a client of the run (0..3)"),
                15: (3, "partition-id 3 is claimed by nodes 15, 16 in this round"),
                16: (3, "partition-id 3 is claimed by nodes 15, 16 in this round"),
                17: (-1, "its partition-id 1.5 is not a client of the run"),
                18: (-1, "it carries no partition-id"),
                19: (-1, "it carries no metrics record")}
    by_hand = {"a.weight": [23 / 8, -23 / 8], "b.weight": [23 / 4]}  # (1*1 + 3*2 + 4*4) / 8, weights 1:3:4
    for rnd, order in ((1, 1), (2, -1)):  # round 2: the replies arrive in the reverse order
        arrays, metrics = strategy.aggregate_train(rnd, replies()[::order])
        assert metrics["num-uploads"] == 3
        for name, value in task.from_record(arrays).items():
            np.testing.assert_allclose(value.numpy(), by_hand[name], rtol=1e-6, err_msg=name)
        failures = [f for f in strategy.failures if f["round"] == rnd]
        assert {f["node"]: f["partition"] for f in failures} == {n: p for n, (p, _) in expected.items()}
        for failure in failures:
            assert failure["phase"] == "train" and failure["reason"].startswith("reply left out of the scores")
            assert expected[failure["node"]][1] in failure["reason"], failure
    assert strategy.history["failed_train"] == [7, 7] and not strategy.run_status()["complete"]
    assert strategy.result_arrays()["lag_num_uploads"].tolist() == [3, 3]


@pytest.mark.parametrize("change, reason", [
    ({"correct": 10 ** 6}, "its correct 1000000 is above its num-examples (4)"),
    ({"correct": -1}, "its correct -1 is not a whole number >= 0"),
    ({"correct": 2.5}, "its correct 2.5 is not a whole number >= 0"),
    ({"num_examples": -4, "correct": 0}, "its num-examples -4 is not a whole number >= 0"),
    ({"num_examples": 99}, "its num-examples 99 is above the test samples it holds (4)"),
    ({"auc": 7.0}, "its auc 7.0 is not a finite number in [0, 1]"),
    ({"auc": -0.5}, "its auc -0.5 is not a finite number in [0, 1]"),
    ({"auc": float("nan")}, "its auc nan is not a finite number in [0, 1]"),
    ({"train_loss_sum": float("inf")}, "its train-loss-sum inf is not a finite number >= 0"),
    ({"train_loss_sum": -1.0}, "its train-loss-sum -1.0 is not a finite number >= 0"),
    ({"train_samples": 10 ** 9}, "its train-samples 1000000000 is above the training samples it holds (5)"),
    ({"correct": None}, "it carries no correct"),
    ({"auc": None}, "it carries no auc"),
    ({"partition_id": None}, "it carries no partition-id"),
    ({"partition_id": 99}, "its partition-id 99 is not a client of the run (0..3)"),
    ({"partition_id": 1}, "partition-id 1 is claimed by nodes 20, 30 in this round"),
    ({"metrics": None}, "it carries no metrics record"),
], ids=["correct-1e6", "correct-negative", "correct-float", "examples-negative", "examples-beyond-test-set",
        "auc-7", "auc-negative", "auc-nan", "loss-inf", "loss-negative", "train-samples-1e9", "no-correct",
        "no-auc", "no-partition", "partition-99", "partition-repeated", "no-metrics"])
def test_a_bad_evaluation_reply_is_a_failure_and_the_round_goes_on(monkeypatch, change, reason):
    """Partitions 0 and 1 (nodes 10, 20) reply honestly; node 30 (partition 2) replies with one bad value. Its
    reply is that node's failure, named; the round's numbers are the honest replies' alone, as computed by
    hand (a repeated partition loses both replies that claim it)."""
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag.selector import LagSettings

    strategy = _strategy(LagSettings(top_k=1), ["a.weight", "b.weight"], num_rounds=1)
    honest = [_evaluate_reply(10, 0, correct=3, auc=0.5, train_loss_sum=2.0, train_samples=2),
              _evaluate_reply(20, 1, correct=1, auc=0.75, train_loss_sum=4.0, train_samples=4)]
    metrics = strategy.aggregate_evaluate(1, [honest[0], _evaluate_reply(30, 2, **change), honest[1]])
    repeated = change.get("partition_id") == 1
    if repeated:  # only partition 0 is left: 3 of 4 right
        assert strategy.history["test_acc"] == [0.75] and strategy.history["clients"] == [[0]]
        assert strategy.history["test_auc"] == [0.5] and strategy.history["train_loss"] == [1.0]
    else:  # (3 + 1) / (4 + 4); AUC (0.5 * 4 + 0.75 * 4) / 8; train loss (2 + 4) / (2 + 4)
        assert strategy.history["test_acc"] == [0.5] and strategy.history["clients"] == [[0, 1]]
        assert strategy.history["test_auc"] == [0.625] and strategy.history["train_loss"] == [1.0]
        assert strategy.history["client_acc"][0].tolist() == [0.75, 0.25]
    assert metrics["accuracy"] == strategy.history["test_acc"][0] and strategy.history["eval_round"] == [1]
    unknown = any(key in change for key in ("partition_id", "metrics")) and not repeated
    nodes = [20, 30] if repeated else [30]
    assert [(f["round"], f["phase"], f["node"], f["partition"]) for f in strategy.failures] == \
        [(1, "evaluate", node, 1 if repeated else -1 if unknown else 2) for node in nodes]
    assert all(f["reason"] == f"reply left out of the evaluation: {reason}" for f in strategy.failures), \
        strategy.failures
    assert strategy.history["failed_evaluate"] == [len(nodes)] and not strategy.run_status()["complete"]


def test_an_evaluation_with_no_usable_reply_leaves_the_round_out(monkeypatch):
    """Round 2's evaluation replies are all bad: both are failures, and the round is recorded as a round
    without an evaluation is (as with -eg): absent from rs_eval_round and from every series aligned with it,
    never a NaN accuracy (reports refuse one). Round 3 is evaluated again, with a node whose test set is
    empty: its AUC is NaN (nothing to rank), which the project's evaluation gives too, so it is accepted."""
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag.selector import LagSettings

    strategy = _strategy(LagSettings(top_k=1), ["a.weight", "b.weight"], num_rounds=3)
    assert strategy.aggregate_evaluate(1, [_evaluate_reply(10, 0, correct=3), _evaluate_reply(20, 1, correct=1)])
    assert strategy.aggregate_evaluate(2, [_evaluate_reply(10, 0, auc=7.0),
                                           _evaluate_reply(20, 1, correct=10 ** 6)]) is None
    assert [(f["round"], f["node"], f["partition"]) for f in strategy.failures] == [(2, 10, 0), (2, 20, 1)]
    strategy.aggregate_evaluate(3, [_evaluate_reply(10, 0, correct=3), _evaluate_reply(20, 1, correct=1),
                                    _evaluate_reply(30, 2, num_examples=0, correct=0, auc=float("nan"))])
    arrays = strategy.result_arrays()
    assert arrays["rs_eval_round"].tolist() == [1, 3] and arrays["rs_test_acc"].tolist() == [0.5, 0.5]
    assert len(arrays["rs_test_auc"]) == len(arrays["rs_train_loss"]) == 2
    assert arrays["rs_failed_evaluate_nodes"].tolist() == [0, 2, 0]
    assert strategy.history["clients"] == [[0, 1], [0, 1, 2]] and len(strategy.failures) == 2


def test_the_server_app_refuses_to_start_without_a_readable_dataset_config(monkeypatch, data_dir, tmp_path):
    """The dataset's config.json bounds every reply by its partition's samples (and gives the model its
    shapes): a ServerApp that has none, or cannot read it, stops before it uses the grid, in one line naming
    what to do, and writes nothing."""
    monkeypatch.syspath_prepend(str(APP))
    from utils.datasets import DatasetError
    from pfl_flower import server_app

    (tmp_path / "none").mkdir()
    shutil.copytree(data_dir / "Toy", tmp_path / "broken" / "Toy")
    (tmp_path / "broken" / "Toy" / "config.json").write_text("{not json")
    for folder, expected in (("none", "dataset 'Toy' not found"), ("broken", "config.json")):
        with pytest.raises(DatasetError) as refused:
            server_app.main(None, _context(tmp_path / folder, tmp_path / "results"))
        assert expected in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())


class _TamperingGrid(_LocalGrid):
    """A :class:`_LocalGrid` whose node ``liar`` changes its replies (``tamper(reply)``); every batch of
    replies is kept, in order, in :attr:`replies`."""

    def __init__(self, contexts, liar, tamper):
        super().__init__(contexts)
        self.liar, self.tamper, self.replies = liar, tamper, []

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if reply.metadata.src_node_id == self.liar:
                self.tamper(reply)
        self.replies.append(replies)
        return replies


def test_a_lying_node_in_a_full_run_is_a_failure_and_the_run_goes_on(monkeypatch, data_dir, tmp_path):
    """Three nodes run the app in this process for 2 rounds with eval-gap 2. Node 12 trains for real but
    claims partition 99, 10^9 samples and all-50s arrays, and at the evaluation claims 10^6 right answers.
    The run completes its rounds, marked incomplete with node 12's failures named; the global model is the
    sample-weighted average of nodes 10 and 11's trained arrays and the accuracy theirs, both computed by
    hand from their replies; the .h5 records the eval-gap the run used."""
    monkeypatch.syspath_prepend(str(APP))
    import torch
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    from pfl_flower import server_app, task

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # a ServerApp process's identity
        monkeypatch.setattr(TaskIdentity, field, value)
    run = {"dataset": "Toy", "num-clients": 3, "model": "DNN", "learning-rate": 0.05, "lag-top-k": 1,
           "lag-granularity": "tensor", "num-server-rounds": 2, "eval-gap": 2, "min-nodes": 3,
           "data-dir": str(data_dir), "results-dir": str(tmp_path), "repo-dir": str(REPO)}

    def tamper(reply):
        metrics = reply.content["metrics"]
        if "arrays" in reply.content:
            metrics["partition-id"], metrics["num-examples"] = 99, 10 ** 9
            trained = task.from_record(reply.content["arrays"])
            reply.content["arrays"] = task.to_record({n: torch.full_like(t, 50.0) for n, t in trained.items()})
        else:
            metrics["correct"] = 10 ** 6

    nodes = {10 + p: Context(run_id=1, node_id=10 + p, node_config={"partition-id": p}, state=RecordDict(),
                             run_config=run) for p in range(3)}
    grid = _TamperingGrid(nodes, 12, tamper)
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run))

    arrays, attrs = read_results(tmp_path / "Toy_FedLAG_flower_0.h5")
    assert attrs["config"]["eval_gap"] == 2 and arrays["rs_eval_round"].tolist() == [2]
    assert not attrs["complete"]
    assert [(f["round"], f["phase"], f["node"], f["partition"]) for f in attrs["failures"]] == \
        [(1, "train", 12, -1), (2, "train", 12, -1), (2, "evaluate", 12, 2)]
    assert all("partition-id 99 is not a client of the run (0..2)" in f["reason"] for f in attrs["failures"][:2])
    assert "its correct 1000000 is above its num-examples" in attrs["failures"][2]["reason"]
    assert arrays["rs_failed_nodes"].tolist() == [1, 1] and arrays["rs_failed_evaluate_nodes"].tolist() == [0, 1]
    assert arrays["lag_num_uploads"].tolist() == [2, 2]

    trained, evaluated = grid.replies[2], grid.replies[3]  # round 2's training and evaluation replies
    honest = [r.content for r in trained if r.metadata.src_node_id != 12]
    counts = [c["metrics"]["num-examples"] for c in honest]
    final = dict(np.load(tmp_path / "Toy_FedLAG_flower_0.global.npz"))
    for name in final:
        by_hand = sum(n * c["arrays"][name].numpy().astype(np.float64) for n, c in zip(counts, honest)) / sum(counts)
        np.testing.assert_allclose(final[name], by_hand, rtol=0, atol=1e-6, err_msg=name)
    scores = [r.content["metrics"] for r in sorted(evaluated, key=lambda r: r.metadata.src_node_id)][:2]
    correct, examples = sum(m["correct"] for m in scores), sum(m["num-examples"] for m in scores)
    assert arrays["rs_test_acc"].tolist() == [correct / examples]
    assert arrays["rs_client_acc"].tolist() == [[m["correct"] / m["num-examples"] for m in scores]]
    assert arrays["rs_client_ids"].tolist() == [[0, 1]]


def test_the_check_rule_and_sketched_uploads_are_refused_by_the_flower_strategy_in_one_line(monkeypatch):
    pytest.importorskip("flwr")
    monkeypatch.syspath_prepend(str(APP))
    from flcore.lag import LagSettings
    with pytest.raises(ValueError, match='lag-share = "check" is not in the Flower app'):
        _strategy(LagSettings(share="check"), ["a.weight", "b.weight"], 2)
    with pytest.raises(ValueError, match='lag-upload = "sketch" is not in the Flower app'):
        _strategy(LagSettings(upload="sketch"), ["a.weight", "b.weight"], 2)
