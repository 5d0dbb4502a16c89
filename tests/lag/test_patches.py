"""patches/apply_pfllib.py: FedLAG added to (and removed from) an upstream-style PFLlib checkout.

The checkout is ``tests/fake_pfllib`` (a small tree with PFLlib's contracts, see its README) copied
into a temporary folder, with tiny data generated here. The installer runs in-process (it is
standard library only); the patched ``main.py`` runs in subprocesses from ``system/``, as upstream's does.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, pinned_thread_env

FAKE = REPO / "tests" / "fake_pfllib"
LAG = REPO / "system" / "flcore" / "lag"
FLAG_FIELDS = "system/utils/flagfields.py"  # the flag machinery lag/settings.py imports, installed beside upstream's
OURS = ("lag_pfllib.", "serverfedlag.", "clientfedlag.", "flagfields.")  # installed module stems (and their .pyc)
NUM_CLIENTS = 4


def _load_installer():
    spec = importlib.util.spec_from_file_location("apply_pfllib", REPO / "patches" / "apply_pfllib.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


installer = _load_installer()


def make_data(root: Path) -> None:
    """4 clients, 8 features, 3 classes, label-skewed so that clients' updates disagree."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 32), ("test", 12)):
        folder = root / "dataset" / "Tiny" / split
        folder.mkdir(parents=True)
        for client in range(NUM_CLIENTS):
            y = rng.choice(3, size=n, p=np.roll([0.7, 0.2, 0.1], client))
            x = rng.normal(0.0, 0.5, (n, 8)).astype(np.float32)
            x[np.arange(n), y] += 2.0
            np.savez(folder / f"{client}.npz", x=x, y=y.astype(np.int64))


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "PFLlib"
    shutil.copytree(FAKE, root, ignore=shutil.ignore_patterns("__pycache__"))
    make_data(root)
    # Upstream's save_results checks for ../results/ and then creates it, so runs started together race
    # for it (FileExistsError); a checkout that has run before holds it, as this one does.
    (root / "results").mkdir()
    return root


def snapshot(root: Path, with_times: bool = False, skip=("results", "__pycache__")) -> dict:
    """Relative path -> bytes (and mtime) of every file, outside run outputs and bytecode caches."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or any(part in skip for part in rel.parts):
            continue
        out[rel.as_posix()] = (path.read_bytes(), path.stat().st_mtime_ns) if with_times else path.read_bytes()
    return out


def install(capsys, root: Path, *flags: str):
    code = installer.main([*flags, str(root)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def start(root: Path, algorithm: str, *extra: str) -> subprocess.Popen:
    # Upstream main.py has no --threads: the tests' thread count goes through the environment.
    env = {k: v for k, v in pinned_thread_env().items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    cmd = [sys.executable, "main.py", "-algo", algorithm, "-dev", "cpu", "-data", "Tiny", "-nc", str(NUM_CLIENTS),
           "-gr", "2", "-lr", "0.1", "-lbs", "8", *extra]
    return subprocess.Popen(cmd, cwd=root / "system", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(process: subprocess.Popen) -> tuple:
    out, _ = process.communicate(timeout=120)
    return process.returncode, out


def read_h5(path: Path) -> dict:
    import h5py
    with h5py.File(path, "r") as hf:
        data = {k: hf[k][()] for k in hf}
        data["attrs"] = dict(hf.attrs)
    return data


def check_personal_stayed_local(results: Path, stem: str, candidates: list, global_prefix: str) -> set:
    """After the final broadcast: LAG-personal tensors and the base method's own personal tensors are
    each client's trained values; every other tensor is the server's global model, on every client."""
    h5 = read_h5(results / f"{stem}.h5")
    names = [n.decode() if isinstance(n, bytes) else n for n in h5["lag_layer_names"]]
    assert names == candidates
    personal = {n for n, keep in zip(names, h5["lag_personal"][-1]) if keep}
    assert 1 <= len(personal) <= 2  # 2 beyond the base method's own, and a tensor without conflict is never chosen
    trained = np.load(results / f"{stem}_trained.npz")
    sent = np.load(results / f"{stem}_broadcast.npz")
    params = sorted(k.split(":", 1)[1] for k in sent.files if k.startswith("client0:"))
    for name in params:
        after = [sent[f"client{c}:{name}"] for c in range(NUM_CLIENTS)]
        if name in personal or name not in candidates:
            for c in range(NUM_CLIENTS):
                np.testing.assert_array_equal(after[c], trained[f"client{c}:{name}"], err_msg=f"{name} client {c}")
            assert any(not np.array_equal(after[0], a) for a in after[1:]), f"{name} is the same on all clients"
        else:
            shared = sent[f"global:{name[len(global_prefix):]}"]
            for c in range(NUM_CLIENTS):
                np.testing.assert_array_equal(after[c], shared, err_msg=f"{name} client {c}")
    return personal


def test_apply_run_both_algorithms_and_revert(checkout, capsys):
    original = snapshot(checkout, with_times=True)

    # --dry-run prints the patch and writes nothing.
    code, out, _ = install(capsys, checkout, "--dry-run")
    assert code == 0
    assert "+++ b/system/main.py" in out and "+    install_lag(parser, globals())" in out
    assert "+++ b/system/flcore/lag/mixin.py" in out and "+++ b/system/flcore/servers/serverfedlag.py" in out
    assert f"+++ b/{FLAG_FIELDS}" in out
    assert snapshot(checkout, with_times=True) == original

    code, out, _ = install(capsys, checkout)
    assert code == 0, out
    for source in LAG.glob("*.py"):  # lag/ is copied unchanged
        assert (checkout / "system/flcore/lag" / source.name).read_bytes() == source.read_bytes()
    # ... and so is the flag machinery its settings import, into upstream's own utils/, recorded for --revert.
    flag_fields = (REPO / FLAG_FIELDS).read_bytes()
    assert FLAG_FIELDS not in original and (checkout / FLAG_FIELDS).read_bytes() == flag_fields
    recorded = json.loads((checkout / installer.MANIFEST).read_text())
    assert recorded["files"][FLAG_FIELDS] == installer.sha256(flag_fields)
    assert "system/utils" not in recorded["folders"]  # upstream's folder: --revert leaves it
    main_py = (checkout / "system/main.py").read_bytes()
    lines = main_py.splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if b">>> FedLAG" in line]
    assert len(begin) == 1 and lines[begin[0] + 4].strip() == b"args = parser.parse_args()"
    assert b"".join(lines[:begin[0]] + lines[begin[0] + 4:]) == original["system/main.py"][0]

    # A second run changes nothing, not even a timestamp.
    installed = snapshot(checkout, with_times=True)
    code, out, _ = install(capsys, checkout)
    assert code == 0 and "nothing to change" in out
    assert snapshot(checkout, with_times=True) == installed

    # Run upstream's main.py: FedLAG, FedRep+LAG (3 of 4 clients per round), plain FedAvg, a bad name.
    # Single tensors as layers and the paper's rule: the mechanics of the patch, on a 3-module model.
    per_tensor = ("--lag_granularity", "tensor", "--lag_schedule", "every_round")
    runs = {"FedLAG": start(checkout, "FedLAG", "--lag_top_k", "2", *per_tensor),
            # K counts FedRep's own head (2 tensors), so 4 adds two of the shared ones.
            "FedRep+LAG": start(checkout, "FedRep+LAG", "-jr", "0.75", "--lag_top_k", "4", *per_tensor),
            "FedAvg": start(checkout, "FedAvg"),
            "Nope+LAG": start(checkout, "Nope+LAG")}
    done = {name: finish(p) for name, p in runs.items()}
    for name in ("FedLAG", "FedRep+LAG", "FedAvg"):
        assert done[name][0] == 0, done[name][1][-3000:]
        assert f"Average best accuracy of {name}" in done[name][1]  # upstream average_data found the files
    code, out = done["Nope+LAG"]
    assert code != 0 and "no branch for 'Nope'" in out and "FedRep+LAG" in out

    results = checkout / "results"
    full = ["base.fc1.weight", "base.fc1.bias", "base.fc2.weight", "base.fc2.bias", "head.weight", "head.bias"]
    check_personal_stayed_local(results, "Tiny_FedLAG_test_0", full, "")
    check_personal_stayed_local(results, "Tiny_FedRep+LAG_test_0", full[:4], "base.")  # head: FedRep's own
    for stem, uploads, top_k in (("Tiny_FedLAG_test_0", 4, 2), ("Tiny_FedRep+LAG_test_0", 3, 4)):
        h5 = read_h5(results / f"{stem}.h5")
        assert len(h5["rs_test_acc"]) == 3 and h5["lag_conflict_scores"].shape[0] == 3
        assert list(h5["lag_num_uploads"]) == [uploads] * 3
        assert f'"top_k": {top_k}' in h5["attrs"]["lag"]
        # Upstream FedRep never resets uploaded_ids; the LAG server re-derives them from the uploads.
        sent = np.load(results / f"{stem}_broadcast.npz")
        assert list(sent["uploaded_ids"]) == list(sent["upload_owners"]) and len(sent["uploaded_ids"]) == uploads
    plain = read_h5(results / "Tiny_FedAvg_test_0.h5")
    assert not any(k.startswith("lag_") for k in plain)  # plain upstream algorithms are untouched

    # --revert: the tree is the original again, byte for byte (run outputs and caches aside).
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and "byte for byte" in out
    assert snapshot(checkout) == {rel: data for rel, (data, _) in original.items()}
    leftovers = [p for p in checkout.rglob("*") if p.name.startswith(OURS) or p.name == "lag"]
    assert leftovers == [] and not (checkout / FLAG_FIELDS).exists()
    assert (checkout / "system/utils/result_utils.py").is_file()  # upstream's utils/ is untouched
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and "nothing to revert" in out


def test_refuses_a_folder_that_is_not_pfllib(tmp_path, checkout, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = install(capsys, empty)
    assert code == 2 and "does not look like a PFLlib checkout" in err and "system/main.py" in err
    assert list(empty.iterdir()) == []
    code, _, err = install(capsys, checkout / "system")
    assert code == 2 and "pass its parent" in err


@pytest.mark.parametrize("old, new, message", [
    ("    args = parser.parse_args()\n", "    args = vars(parser.parse_args())\n",
     "no `args = parser.parse_args()` line"),
    ("    args = parser.parse_args()\n", "    args = parser.parse_args()\n    again = parser.parse_args()\n",
     "calls parse_args() 2 times"),
    ("def run(args):", "def run_all(args):", "no module-level function run(args)"),
    ('if args.algorithm == "FedAvg":', 'if args.algo_name == "FedAvg":', "FedAvg"),
])
def test_refuses_a_main_py_it_cannot_place_its_block_in(checkout, capsys, old, new, message):
    main_py = checkout / "system/main.py"
    text = main_py.read_text()
    assert old in text
    main_py.write_text(text.replace(old, new))
    if message == "FedAvg":  # FedRep's branch still dispatches: install, but warn that FedLAG is unavailable
        code, out, _ = install(capsys, checkout)
        assert code == 0 and "-algo FedLAG is unavailable" in out
        return
    before = snapshot(checkout, with_times=True)
    code, _, err = install(capsys, checkout)
    assert code == 2 and message in err and "nothing changed" in err
    assert snapshot(checkout, with_times=True) == before


def test_crlf_main_py_is_restored_byte_for_byte(checkout, capsys):
    main_py = checkout / "system/main.py"
    original = main_py.read_bytes().replace(b"\n", b"\r\n")
    main_py.write_bytes(original)
    assert install(capsys, checkout)[0] == 0
    patched = main_py.read_bytes()
    assert patched.count(b"\r\n") == original.count(b"\r\n") + 4 and b"\n" not in patched.replace(b"\r\n", b"")
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and main_py.read_bytes() == original


def test_edited_block_or_lost_manifest_is_refused(checkout, capsys):
    main_py = checkout / "system/main.py"
    original = main_py.read_bytes()
    assert install(capsys, checkout)[0] == 0
    main_py.write_bytes(main_py.read_bytes().replace(b"install_lag(parser, globals())",
                                                     b"install_lag(parser, globals())  # mine"))
    code, _, err = install(capsys, checkout, "--revert")
    assert code == 2 and "edited" in err
    code, _, err = install(capsys, checkout)
    assert code == 2 and "edited by hand" in err
    code, out, _ = install(capsys, checkout, "--revert", "--force")
    assert code == 0 and main_py.read_bytes() == original

    assert install(capsys, checkout)[0] == 0
    (checkout / installer.MANIFEST).unlink()
    for flags in ((), ("--revert",)):
        code, _, err = install(capsys, checkout, *flags)
        assert code == 2 and "fedlag_patch.json is missing" in err


@pytest.mark.parametrize("rel, source", [("system/flcore/servers/serverfedlag.py", "patches/pfllib/serverfedlag.py"),
                                         (FLAG_FIELDS, FLAG_FIELDS)], ids=["server", "flag-machinery"])
@pytest.mark.parametrize("content", [b"# someone's own FedLAG\n", None], ids=["other", "identical-unrecorded"])
def test_existing_file_with_other_content_is_refused(checkout, capsys, content, rel, source):
    # An identical copy the installer did not record is refused too: --revert would remove it.
    target = checkout / rel
    target.write_bytes(content or (REPO / source).read_bytes())
    before = snapshot(checkout, with_times=True)
    code, _, err = install(capsys, checkout)
    assert code == 2 and f"{rel} (not installed by this patch)" in err
    assert snapshot(checkout, with_times=True) == before


def test_dispatch_reader_finds_upstream_branches():
    hook = installer.hook
    source = (FAKE / "system/main.py").read_text()
    assert hook.dispatch(source) == {"FedAvg": "FedAvg", "FedRep": "FedRep"}
    # Upstream's other spellings: single quotes, a class named unlike the algorithm, a branch with no server.
    variant = ('def run(args):\n    if args.algorithm == "LG-FedAvg":\n        args.head = 1\n'
               '        server = LG_FedAvg(args, i)\n\n    elif args.algorithm == \'FedCAC\':  # mine\n'
               '        server = FedCAC(args, i)\n    elif args.algorithm == "Broken":\n        pass\n'
               '    else:\n        raise NotImplementedError\n    server.train()\n')
    assert hook.dispatch(variant) == {"LG-FedAvg": "LG_FedAvg", "FedCAC": "FedCAC"}
    assert hook.base_algorithm("FedLAG") == "FedAvg" and hook.base_algorithm("FedRep+LAG") == "FedRep"
    assert hook.base_algorithm("FedRep") is None


@pytest.mark.parametrize("earlier_format", [False, True], ids=["manifest", "earlier-manifest-format"])
def test_second_apply_refreshes_files_from_an_older_install(checkout, capsys, earlier_format):
    original = snapshot(checkout)
    assert install(capsys, checkout)[0] == 0
    glue = checkout / "system/flcore/lag_pfllib.py"
    current = glue.read_bytes()
    manifest_path = checkout / installer.MANIFEST
    manifest = manifest_path.read_text()
    older = b"# an older lag_pfllib.py\n"
    glue.write_bytes(older)  # as if an older version of the patch had installed this
    older_manifest = json.loads(manifest.replace(installer.sha256(current), installer.sha256(older)))
    if earlier_format:  # the manifest that earlier versions of the installer wrote
        older_manifest = {"format": 1, "files": older_manifest["files"], "adopted": [],
                          "dirs": older_manifest["folders"], "main": {
                              "path": installer.MAIN, "block": older_manifest["block"],
                              "sha256_before": older_manifest["main_py_before"], "sha256_after": "0" * 64}}
    manifest_path.write_text(json.dumps(older_manifest))
    code, out, _ = install(capsys, checkout)
    assert code == 0 and "update  system/flcore/lag_pfllib.py" in out
    assert glue.read_bytes() == current and manifest_path.read_text() == manifest
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and "byte for byte" in out and snapshot(checkout) == original


def test_updating_an_install_from_before_the_flag_machinery_moved(checkout, capsys):
    """Installs made when the flag declaration was lag/flagfields.py: the update removes that file and
    installs system/utils/flagfields.py in its place; --revert then leaves the original tree."""
    original = snapshot(checkout)
    assert install(capsys, checkout)[0] == 0
    manifest_path = checkout / installer.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    old_rel, flag_fields = "system/flcore/lag/flagfields.py", (REPO / FLAG_FIELDS).read_bytes()
    (checkout / FLAG_FIELDS).unlink()
    (checkout / old_rel).write_bytes(flag_fields)
    manifest["files"][old_rel] = manifest["files"].pop(FLAG_FIELDS)
    manifest_path.write_text(json.dumps(manifest))
    code, out, _ = install(capsys, checkout)
    assert code == 0 and f" remove  {old_rel}" in out and f" create  {FLAG_FIELDS}" in out
    assert not (checkout / old_rel).exists() and (checkout / FLAG_FIELDS).read_bytes() == flag_fields
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and "byte for byte" in out and snapshot(checkout) == original


class Plain:
    """A server class for the hook test."""


def report_run(args):
    """A stand-in for main.py's run: what its branch would see."""
    return args.algorithm == "FedAvg", str(args.algorithm), FedAvg  # noqa: F821 (FedAvg: the namespace's)


def test_hook_defers_to_own_branches_and_refuses_clearly(tmp_path):
    import argparse
    hook = installer.hook
    main_py = tmp_path / "main.py"
    main_py.write_text('def run(args):\n    if args.algorithm == "FedLAG":\n        server = Mine(args, 0)\n'
                       '    elif args.algorithm == "FedAvg":\n        server = FedAvg(args, 0)\n')
    namespace = {"__file__": str(main_py), "run": lambda args: f"ran {args.algorithm}"}
    parser = argparse.ArgumentParser()
    hook.install_lag(parser, namespace)
    hook.install_lag(parser, namespace)  # a second call neither re-adds flags nor re-wraps
    args = parser.parse_args(["--lag_top_k", "3"])
    assert args.lag_top_k == 3 and args.lag_schedule == "smoothed" and args.lag_granularity == "module"
    assert namespace["run"](argparse.Namespace(algorithm="FedLAG")) == "ran FedLAG"  # the user's own branch
    assert namespace["run"](argparse.Namespace(algorithm="FedAvg")) == "ran FedAvg"

    # X+LAG: run's own code takes X's branch and builds the LAG class; main.py's globals and args are unchanged.
    namespace = dict(namespace, FedAvg=Plain, run=report_run)
    hook.install_lag(parser, namespace)
    args = argparse.Namespace(algorithm="FedAvg+LAG")
    took_branch, name, server_class = namespace["run"](args)
    assert took_branch and name == "FedAvg+LAG" and server_class.__name__ == "Plain_LAG"
    assert [c.__name__ for c in server_class.__mro__[1:]] == [
        "UpstreamDelivery", "LayerConflictMixin", "LagRecords", "Plain", "UpstreamCompat", "Plain", "object"]  # glue named after X
    assert server_class.lag_base.__name__ == "Plain" and issubclass(server_class.lag_base, Plain)
    assert namespace["FedAvg"] is Plain and args.algorithm == "FedAvg+LAG" and type(args.algorithm) is str
    with pytest.raises(SystemExit, match="no branch for 'FedRep'.*FedAvg\\+LAG"):
        namespace["run"](argparse.Namespace(algorithm="FedRep+LAG"))
    with pytest.raises(SystemExit, match="Local shares no parameters"):
        namespace["run"](argparse.Namespace(algorithm="Local+LAG"))
    with pytest.raises(SystemExit, match="--lag_upload sketch is not available in a PFLlib checkout"):
        namespace["run"](argparse.Namespace(algorithm="FedAvg+LAG", lag_upload="sketch"))


def test_inside_pfllib_a_groups_model_reaches_its_members_live_models_at_aggregation():
    """Upstream's clients hold live models and its loop reads them directly: the adapter writes what a
    client receives beyond the broadcast (its group's model) into its model at the end of aggregation,
    and upstream's broadcast then keeps it (it is among the personal layers it puts back)."""
    import torch
    from types import SimpleNamespace

    class Upstream:  # what the adapter relies on: live client models, an aggregation step
        def __init__(self):
            self.clients = [SimpleNamespace(id=i, model=torch.nn.Linear(2, 1)) for i in range(3)]
            self.aggregated = False

        def aggregate_parameters(self):
            self.aggregated = True

    group_model = {"weight": torch.tensor([[1.5, -2.0]]), "bias": torch.tensor([0.25])}

    class Grouped(installer.hook.UpstreamDelivery, installer.hook.UpstreamCompat, Upstream):
        def personal_payload(self, client_id):
            return group_model if client_id < 2 else None

    server = Grouped()
    alone = {n: t.detach().clone() for n, t in server.clients[2].model.state_dict().items()}
    server.aggregate_parameters()
    assert server.aggregated
    for client in server.clients[:2]:
        assert all(torch.equal(client.model.state_dict()[n], t) for n, t in group_model.items())
    assert all(torch.equal(server.clients[2].model.state_dict()[n], t) for n, t in alone.items())


# ----- all or nothing: real write failures part-way -------------------------------------------------------
def tree(root: Path) -> dict:
    """Every path under ``root`` (folders too) -> bytes, permission bits and mtime for files, None for folders."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        out[rel] = None if path.is_dir() else (path.read_bytes(), path.stat().st_mode, path.stat().st_mtime_ns)
    return out


def installer_with_file_size_limit(limit: int, *argv: str) -> subprocess.CompletedProcess:
    """The installer in a subprocess whose writes fail past ``limit`` bytes per file (RLIMIT_FSIZE: the
    kernel answers EFBIG, 'File too large'), a real write error even for root, part-way through."""
    import resource

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([sys.executable, str(REPO / "patches" / "apply_pfllib.py"), *argv], capture_output=True,
                          text=True, timeout=60, preexec_fn=limit_file_size)


def test_a_write_error_part_way_changes_nothing_and_a_retry_installs_and_reverts_cleanly(checkout, capsys):
    sizes = {rel: len(data) for rel, data in installer.payload().items()}
    largest = max(sizes, key=sizes.get)
    assert list(sizes).index(largest) > 0  # files come before it: a naive install would have written them
    original = tree(checkout)
    failed = installer_with_file_size_limit(sizes[largest] - 1, str(checkout))
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr.splitlines() == [f"apply_pfllib.py: refusing, nothing changed: cannot write {largest} "
                                          "(File too large); fix that and run again"]
    assert tree(checkout) == original  # byte for byte, modes and times; no folder or temporary file left

    code, out, _ = install(capsys, checkout)  # the retry creates every file
    assert code == 0 and all(f" create  {rel}" in out for rel in sizes)
    patched = tree(checkout)
    failed = installer_with_file_size_limit(100, "--revert", str(checkout))  # main.py cannot be rewritten
    assert failed.returncode == 2 and failed.stderr.startswith(
        "apply_pfllib.py: refusing, nothing changed: cannot write system/main.py (File too large)"), failed.stderr
    assert tree(checkout) == patched
    code, out, _ = install(capsys, checkout, "--revert")
    assert code == 0 and "restored system/main.py byte for byte" in out
    assert {rel: entry and entry[0] for rel, entry in tree(checkout).items()} == \
        {rel: entry and entry[0] for rel, entry in original.items()}  # nothing left behind


@pytest.mark.parametrize("make_unwritable, named", [
    (lambda root: (root / "system/flcore/servers/serverfedlag.py").mkdir(),
     "cannot read system/flcore/servers/serverfedlag.py (Is a directory)"),
    (lambda root: (root / "system/flcore/lag").write_text("not a folder\n"),
     "cannot write system/flcore/lag/__init__.py (Not a directory)"),
    (lambda root: (root / installer.MANIFEST).mkdir(),
     "cannot read system/flcore/fedlag_patch.json (Is a directory)"),
], ids=["target-is-a-folder", "target-under-a-file", "manifest-is-a-folder"])
def test_a_target_that_cannot_be_written_is_refused_and_nothing_changes(checkout, capsys, make_unwritable, named):
    make_unwritable(checkout)
    before = tree(checkout)
    code, out, err = install(capsys, checkout)
    assert code == 2 and err.startswith(f"apply_pfllib.py: refusing, nothing changed: {named}"), err
    assert tree(checkout) == before
