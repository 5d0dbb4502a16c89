"""What a client keeps of its own, and the client-state store: a budget (``--state_memory``) beyond which
the least recently used clients' own tensors go to checksummed files and come back when used, with
results bit-identical to keeping everything in memory, checkpoints that name the files, and refusals of
what cannot work."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import app.memory as memory
import app.run
from flcore.aggregation import named_tensors
from flcore.clients.spill_files import SpillRecord, StoreError
from flcore.clients.state_store import ClientStateStore
from helpers import cli, main_command, results_file, run_of, server_for, train
from utils.result_utils import read_results
from utils.sizes import format_size, parse_size

TIMING = {"rs_round_time"}


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def same_results(a, b) -> None:
    got, expected = read_results(results_file(a))[0], read_results(results_file(b))[0]
    assert set(got) == set(expected)
    for name in set(got) - TIMING:
        assert np.array_equal(got[name], expected[name]), name


# ----- what a client owns -----------------------------------------------------------------------
def test_a_fedavg_client_owns_nothing_and_a_fedper_client_only_its_head(data_dir, tmp_path):
    fedavg = server_for(data_dir, tmp_path / "a", "-algo", "FedAvg", "-gr", "1")
    fedper = server_for(data_dir, tmp_path / "p", "-algo", "FedPer", "-gr", "1")
    for server in (fedavg, fedper):
        train(server)
        server.send_models()
        for client in server.clients:
            client.park()
    assert all(c.own_bytes() == 0 for c in fedavg.clients)
    head = tensor_bytes(named_tensors(fedper.global_model.head))
    trained = {u for u in fedper.trained_updates} | {c.id for c in fedper.selected_clients}
    for client in fedper.clients:
        own = client.own_tensors()
        assert all(key.startswith("module/model/head.") for key in own)
        assert client.own_bytes() == (head if client.id in trained else 0)


def test_scaffold_control_variates_are_own_state_once_trained(data_dir, tmp_path):
    """Before training c_i = c = delta_c = 0: one frozen set of zeros all clients share, owned by none.
    A trained client owns c_i only (delta_c left in its upload); c is the server's frozen copy, one for
    every client."""
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "-gr", "0", "-jr", "0.5")
    model = tensor_bytes({n: p for n, p in server.global_model.named_parameters()})
    assert all(c.own_bytes() == 0 for c in server.clients)
    train(server)
    trained = {c.id for c in server.selected_clients}
    for client in server.clients:
        attributes = {key: t for key, t in client.own_tensors().items() if key.startswith("attr/")}
        assert {key.split("/")[1] for key in attributes} == ({"control"} if client.id in trained else set())
        assert tensor_bytes(attributes) == (model if client.id in trained else 0)
    received = [c.server_control for c in server.clients if c.id in trained]
    assert all(value is received[0] for value in received)



def test_a_parked_client_has_no_model_until_checked_out_and_nothing_checks_it_out_behind_the_codes_back(
        data_dir, tmp_path):
    """Parked, a Ditto client's modules are not attributes: reading one is an AttributeError, not a silent
    check-out; check_out() makes them plain attributes (the personal model a
    working module holding exactly the store's tensors), and park() puts them back in the table unchanged."""
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-gr", "1", "-jr", "1")
    train(server)
    client = server.clients[0]
    own = {key: t.clone() for key, t in client.own_tensors().items()}
    assert any(key.startswith("module/model_per/") for key in own)
    for name in ("model", "model_per"):
        with pytest.raises(AttributeError):
            getattr(client, name)
    assert not client.needs_parking() and server.state_store.keys(client.id) == frozenset(own)
    client.check_out()
    assert isinstance(client.model_per, torch.nn.Module) and not server.state_store.keys(client.id)
    for name, tensor in named_tensors(client.model_per).items():
        assert torch.equal(tensor, own[f"module/model_per/{name}"]), name
    client.park()
    assert "model_per" not in vars(client) and not hasattr(client, "model")
    assert all(torch.equal(t, own[key]) for key, t in client.own_tensors().items())
    assert set(client.own_tensors()) == set(own)

# ----- the store on its own -----------------------------------------------------------------------
def test_files_are_named_by_their_bytes_and_refused_when_altered(tmp_path):
    store = ClientStateStore(budget=None, folder=tmp_path)
    tensors = {"module/model/w": torch.arange(6.0).reshape(2, 3), "attr/c/x": torch.ones(4, dtype=torch.float64)}
    record = store.files.write(tensors)
    again = store.files.write({k: v.clone() for k, v in tensors.items()})
    assert again.digest == record.digest and len(list(tmp_path.iterdir())) == 1
    back = store.files.read(record)
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    path = store.files.path_of(record)
    data = path.read_bytes()
    from safetensors.torch import save
    assert data == save(tensors)  # streamed to the file, yet the bytes safetensors makes in memory
    path.write_bytes(data[:-3])
    assert "truncated or altered" in store.files.problem(record)
    with pytest.raises(StoreError, match="truncated or altered"):
        store.files.read(record)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "truncated or altered" in store.files.problem(record)
    path.unlink()
    assert "cannot be read" in store.files.problem(record)


def test_a_file_of_the_same_name_and_size_is_rewritten_not_trusted(tmp_path):
    """A spill of bytes whose file is there already, altered in place since (same size), puts good bytes back."""
    store = ClientStateStore(budget=None, folder=tmp_path)
    tensors = {"attr/c": torch.arange(8.0)}
    record = store.files.write(tensors)
    path = store.files.path_of(record)
    good = path.read_bytes()
    path.write_bytes(good[:-4] + bytes(b ^ 0xFF for b in good[-4:]))
    assert "truncated or altered" in store.files.problem(record)
    assert store.files.write({k: v.clone() for k, v in tensors.items()}) == record
    assert path.read_bytes() == good and store.files.problem(record) is None
    assert torch.equal(store.files.read(record)["attr/c"], tensors["attr/c"])


def test_a_folder_at_a_files_name_is_refused_in_one_line_and_left_alone(tmp_path):
    from utils.checkpoint import remove_checkpoints, save_checkpoint
    folder = tmp_path / "client-state"
    store = ClientStateStore(budget=None, folder=folder)
    tensors = {"attr/c": torch.arange(8.0)}
    record = store.files.write(tensors)
    path = store.files.path_of(record)
    path.unlink()
    path.mkdir()
    (path / "notes.txt").write_text("not the store's")
    assert "cannot be read" in store.files.problem(record)
    with pytest.raises(StoreError) as refused:
        store.files.write(tensors)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"{path} is a folder" in message and "move it away" in message
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left
    store.files.released(record)   # nobody names it any more: the store would remove its file
    store.files.pin(0, kept=2)
    store.files.close(keep_checkpointed=False)
    save_checkpoint(tmp_path, 0, {"x": 1})
    remove_checkpoints(tmp_path)  # a completed run's clean-up
    assert (path / "notes.txt").read_text() == "not the store's"
    assert not (tmp_path / "round_000000.pt").exists()


@pytest.fixture
def umask():
    """``os.umask`` for a test to set; the process's umask is put back after it."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_spilled_state_follows_the_umask_as_the_checkpoint_naming_it_does(tmp_path, umask, mask):
    from utils.checkpoint import save_checkpoint
    umask(mask)
    store = ClientStateStore(budget=None, folder=tmp_path / "client-state")
    spilled = store.files.path_of(store.files.write({"attr/c": torch.arange(8.0)}))
    checkpoint = save_checkpoint(tmp_path, 0, {"x": 1})
    expected = 0o666 & ~mask
    assert {oct(p.stat().st_mode & 0o777) for p in (spilled, checkpoint)} == {oct(expected)}
    assert oct((tmp_path / "client-state").stat().st_mode & 0o777) == oct(0o777 & ~mask)


def entry(nbytes: int) -> dict:
    """A client's own state of ``nbytes`` bytes (float32 values)."""
    return {"attr/c": torch.zeros(nbytes // 4)}


def test_freed_memory_goes_back_to_the_system_once_enough_was_spilled(monkeypatch, tmp_path):
    import flcore.clients.state_store as state_store
    trims = []
    monkeypatch.setattr(state_store, "release_free_memory", lambda: trims.append(len(store._files)))
    mb = 1 << 20
    store = ClientStateStore(budget=30 * mb, folder=tmp_path)
    for cid in range(5):
        store.put(cid, entry(20 * mb))
    # Each new client pushes out the least recent, 20 MB each: a trim once 32 MB or more were spilled.
    assert sorted(store._files) == [0, 1, 2, 3] and trims == [2, 4] and store.resident_bytes == 20 * mb


def test_room_is_made_from_the_least_recent_entries_never_the_one_asking_nor_one_in_use(tmp_path):
    store = ClientStateStore(budget=120, folder=tmp_path)
    for cid in range(3):
        store.put(cid, entry(40))
    taken = store.take(0)  # in use (checked out): out of the table, so never spilled
    assert torch.equal(taken["attr/c"], torch.zeros(10)) and store.resident_bytes == 80
    store.make_room(80, keep=1)  # 80 + 80 > 120: 40 must go, and only client 2 may go
    assert store.is_spilled(2) and not store.is_spilled(1) and store.resident_bytes == 40
    store.make_room(80)  # 40 + 80 fits
    assert not store.is_spilled(1)


def test_what_a_pending_upload_does_not_hold_spills_and_the_entry_is_whole_again_after_the_round(tmp_path):
    """SCAFFOLD's case: the upload holds the trained model, c_i is only the client's. Over the budget with
    every other entry gone, c_i goes to a file while the upload is pending; after the round each entry is
    in one place again, the least recent spilled whole where the budget cannot take it back."""
    kb = 4000  # bytes of each tensor (1,000 floats): a file's header is small beside it
    store = ClientStateStore(budget=10_000, folder=tmp_path)
    store.uploading([1, 2])
    entries = {cid: {"module/model/w": torch.full((1000,), float(cid)),
                     "attr/control/w": torch.full((1000,), -float(cid))} for cid in (1, 2)}
    for cid, values in entries.items():
        store.put(cid, values)
    assert store.resident_bytes == 4 * kb and store.uploading_bytes() == 4 * kb  # nothing said yet: all kept
    store.held_by_upload(1, [entries[1]["module/model/w"]])
    kept, record = store.peek(1)
    assert record is not None and set(store.files.read(record)) == {"attr/control/w"}
    assert kept["attr/control/w"].device.type == "meta" and kept["module/model/w"] is entries[1]["module/model/w"]
    assert store.resident_bytes == 3 * kb and store.uploading_bytes() == 3 * kb  # client 2 has said nothing
    assert store.owned_bytes(1) == record.nbytes + kb  # its file's size, and what stayed
    store.held_by_upload(2, [entries[2]["module/model/w"]])
    assert store.resident_bytes == 2 * kb and store.uploading_bytes() == 2 * kb and store.is_spilled(2)
    store.uploaded()
    # Client 1 (least recent): its c_i does not fit beside both models and nothing else may go, so all of it
    # goes to one file; client 2's c_i then fits beside client 2's model and comes back.
    _, whole = store.peek(1)
    assert whole is not None and set(store.files.read(whole)) == set(entries[1])
    assert store.resident_bytes == 2 * kb and store.owned_bytes(1) == whole.nbytes
    assert not store.is_spilled(2) and store.owned_bytes(2) == 2 * kb
    for cid, values in entries.items():
        back = store.get(cid)
        assert all(torch.equal(back[key], value) for key, value in values.items())


def test_an_entry_is_a_value_the_table_keeps_in_memory_or_in_a_file(tmp_path):
    store = ClientStateStore(budget=100, folder=tmp_path)
    values = {"module/model/head.weight": torch.arange(12.0), "attr/c/w": torch.ones(3)}
    store.put(7, values)
    assert store.owned_bytes(7) == 60 and store.keys(7) == set(values)
    store.put(8, entry(80))  # over the budget: the least recently used entry goes to a file
    assert store.is_spilled(7) and store.resident_bytes == 80
    kept, record = store.peek(7)  # what a checkpoint saves: stand-ins and the file's name
    assert record is not None and all(t.device.type == "meta" for t in kept.values())
    back = store.get(7)  # read back; room made first (client 8 goes)
    assert all(torch.equal(back[k], v) for k, v in values.items())
    assert store.is_spilled(8) and not store.is_spilled(7) and store.files.read_back == 1
    store.put(7, {})  # owns nothing now: no entry
    assert store.owned_bytes(7) == 0 and store.keys(7) == set()
    with pytest.raises(StoreError, match="cannot hold one client's own state"):
        store.put(9, entry(104))


def test_a_template_keeps_no_values_and_its_working_modules_have_the_examples_layout():
    from torch import nn
    from flcore.clients.parked_modules import ModuleTemplate, load_module, park_module

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
            self.bn = nn.BatchNorm2d(4)
            self.embed, self.out = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
            self.out.weight = self.embed.weight  # one tensor in two submodules
            self.conv.bias.requires_grad_(False)
    example = Tied()
    template = ModuleTemplate(example)
    assert all(t.is_meta for t in named_tensors(template.prototype).values())  # not a model's worth of memory
    working = load_module(park_module(example, template, {}))
    for (name, made), (_, original) in zip(named_tensors(working).items(), named_tensors(example).items()):
        assert made.device == original.device and made.stride() == original.stride(), name
        assert made.requires_grad == original.requires_grad and torch.equal(made, original), name
    assert working.out.weight is working.embed.weight and type(working.bn.running_mean) is torch.Tensor


def test_a_record_is_checked_before_it_is_trusted():
    good = {"digest": "a" * 64, "bytes": 10, "device": "cpu"}
    assert SpillRecord.from_state(good) == SpillRecord("a" * 64, 10, "cpu")
    for bad in ({**good, "digest": "../" + "a" * 61}, {**good, "bytes": -1}, {**good, "bytes": True},
                {**good, "extra": 1}, ["a" * 64, 10, "cpu"], None):
        with pytest.raises(ValueError):
            SpillRecord.from_state(bad)


def test_sizes_as_people_write_them():
    assert parse_size("2G") == 2 * 10**9 and parse_size("512mb") == 512 * 10**6
    assert parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size("4096") == 4096
    for bad in ("", "G", "2X", "-1G", "nan", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(2 * 10**9) == "2.0 GB" and format_size(999) == "999 B"


# ----- spilling changes no result ------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["Ditto", "SCAFFOLD", "FedPer", "Local"])
def test_a_run_that_spills_equals_one_that_keeps_everything(algorithm, data_dir, tmp_path, monkeypatch):
    """A budget of about two clients' own state: most clients live in files most of the time. Only the
    tensors the round's uploads hold (never spilled: that would free nothing) may take the total over the
    budget, also when the server aggregates: what else a pending client owns (Ditto's personal model,
    SCAFFOLD's c_i) spills before. The count is what the clients own."""
    kept = server_for(data_dir, tmp_path / "kept", "-algo", algorithm, "-gr", "3", "-jr", "0.5")
    train(kept)
    per_client = max(c.own_bytes() for c in kept.clients)
    budget = str(2 * per_client + 1)
    spilled = server_for(data_dir, tmp_path / "spilled", "-algo", algorithm, "-gr", "3", "-jr", "0.5",
                         "--state_memory", budget)
    store = spilled.state_store
    seen = []
    original_put = store.put

    def put(client_id, tensors, used=True):
        original_put(client_id, tensors, used)
        seen.append(store.resident_bytes - store.uploading_bytes())
    store.put = put
    before_read = []
    original_read = store.files.read

    def read(record):  # room is made first: what is read back fits beside what stays resident
        if not completing:
            before_read.append(store.resident_bytes - store.uploading_bytes() + record.nbytes)
        return original_read(record)
    store.files.read = read
    completing, spill_rest = [], store._spill_rest

    def complete(client_id):  # an entry that spilled in part goes to a file whole: its part passes through
        completing.append(client_id)
        spill_rest(client_id)
        completing.clear()
    store._spill_rest = complete
    exact = []
    park_clients = app.run.park_clients

    def park_and_count(server):  # after every hook: the count is what the resident clients own now
        park_clients(server)
        exact.append(store.resident_bytes == sum(c.own_bytes() - store.spilled_bytes(c.id) for c in server.clients))
    monkeypatch.setattr(app.run, "park_clients", park_and_count)
    at_aggregation, partial = [], []
    aggregate, spill = spilled.aggregate_parameters, store._spill

    def aggregate_and_count():
        at_aggregation.append(store.resident_bytes - store.uploading_bytes())
        aggregate()

    def spill_and_count(client_id, keys=None):
        partial.append(keys is not None)
        spill(client_id, keys)
    spilled.aggregate_parameters, store._spill = aggregate_and_count, spill_and_count
    train(spilled)
    assert exact and all(exact)
    assert at_aggregation and max(at_aggregation) <= int(budget)
    # What a pending client owns beyond what its upload holds spills before the server aggregates (Local
    # uploads nothing: its clients are never pending).
    assert any(partial) == (algorithm != "Local")
    same_results(spilled, kept)
    assert store.files.written > 0 and store.files.read_back > 0
    assert max(seen) <= int(budget) and before_read and max(before_read) <= int(budget)
    assert not store.files.folder.exists()  # a completed run leaves no client-state file


def test_a_run_under_the_least_default_budget_spills_with_the_same_results(data_dir, tmp_path, monkeypatch):
    """Free memory so short that auto keeps only four models' worth (two Ditto clients' state) of six
    clients': they go to files and come back, and every result equals the run that keeps all in memory."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # no limit
    kept = server_for(data_dir, tmp_path / "kept", "-algo", "Ditto", "-gr", "3", "-jr", "0.5")
    train(kept)
    floor = memory.FLOOR_MODELS * memory.model_bytes(kept.global_model)
    monkeypatch.setattr(memory, "needed_bytes", lambda model, info, clients: 0)
    monkeypatch.setattr(memory, "available_bytes", lambda device: floor + 1)
    spilled = server_for(data_dir, tmp_path / "spilled", "-algo", "Ditto", "-gr", "3", "-jr", "0.5")
    assert spilled.state_store.budget == floor
    train(spilled)
    assert spilled.state_store.files.written > 0 and spilled.state_store.files.read_back > 0
    same_results(spilled, kept)


def test_the_budget_must_hold_one_clients_state(data_dir, tmp_path):
    done = subprocess.run(main_command(*cli(data_dir, tmp_path, "-algo", "Ditto", "--state_memory", "100")),
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()
    assert len(line) == 1 and "--state_memory 100 B cannot hold one client's own state" in line[0]
    assert "raise --state_memory" in line[0] and "Results so far kept" in line[0]


def test_a_bad_size_is_refused_by_the_command_line(data_dir, tmp_path):
    done = subprocess.run(main_command(*cli(data_dir, tmp_path, "--state_memory", "lots")),
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--state_memory" in done.stderr and "is not a size" in done.stderr


# ----- checkpoints and resume -----------------------------------------------------------------------
class Interrupted(BaseException):
    """Stands for the run being killed after a round (nothing in the run catches it)."""


def interrupted_after(server, rnd: int):
    """Train ``server`` until its ``end_round`` of round ``rnd``, which is cut short like a kill."""
    original = server.end_round

    def end_round(current):
        if current == rnd:
            raise Interrupted
        original(current)
    server.end_round = end_round
    with pytest.raises(Interrupted):
        train(server)


SPILLING = ("-algo", "Ditto", "-gr", "5", "-jr", "0.5", "--checkpoint_every", "1")


def spilling_budget(data_dir, tmp_path) -> str:
    probe = server_for(data_dir, tmp_path / "probe", *SPILLING[:2], "-gr", "0")
    train(probe)
    return str(2 * max(c.own_bytes() for c in probe.clients) + 1)


def killed_spilling_run(data_dir, tmp_path, flags=SPILLING, killed_in: int = 3):
    """``(reference, budget, results, folder)``: an uninterrupted run of ``flags``, the budget under which the
    same run spills, that run's results folder after it was killed in round ``killed_in``, and the folder of
    its checkpoints."""
    reference = server_for(data_dir, tmp_path / "reference", *flags)
    train(reference)
    budget = spilling_budget(data_dir, tmp_path)
    results = tmp_path / "spilled"
    interrupted_after(server_for(data_dir, results, *flags, "--state_memory", budget), killed_in)
    folder = next((results / "checkpoints").rglob(f"round_{killed_in - 1:06d}.pt")).parent
    return reference, budget, results, folder


def test_a_checkpoint_names_the_files_and_resuming_from_it_equals_an_uninterrupted_run(data_dir, tmp_path):
    reference = server_for(data_dir, tmp_path / "reference", *SPILLING)
    train(reference)
    budget = spilling_budget(data_dir, tmp_path)
    results = tmp_path / "spilled"
    first = server_for(data_dir, results, *SPILLING, "--state_memory", budget)
    interrupted_after(first, 3)
    folder = next((results / "checkpoints").rglob("round_000002.pt")).parent
    payload = torch.load(folder / "round_000002.pt", weights_only=True)
    records = [c["stored_in"] for c in payload["server"]["clients"] if "stored_in" in c]
    assert records, "no client was spilled when the checkpoint was taken"
    for record in records:  # each names a file that is kept, and holds no values of its own tensors
        assert (folder / "client-state" / f"{record['digest']}.safetensors").is_file()
    resumed = server_for(data_dir, results, *SPILLING, "--state_memory", budget, "--resume")
    train(resumed)
    same_results(resumed, reference)
    assert not (results / "checkpoints").exists()  # the complete run took its checkpoints and files away


def test_an_altered_client_state_file_is_named_and_its_checkpoint_refused(data_dir, tmp_path, capsys):
    reference, budget, results, folder = killed_spilling_run(data_dir, tmp_path)
    payload = torch.load(folder / "round_000002.pt", weights_only=True)
    digest = next(c["stored_in"]["digest"] for c in payload["server"]["clients"] if "stored_in" in c)
    path = folder / "client-state" / f"{digest}.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    resumed = server_for(data_dir, results, *SPILLING, "--state_memory", budget, "--resume")
    note = capsys.readouterr().out
    assert "round_000002.pt: does not fit this run" in note  # skipped, for the older one or round 0
    assert f"client state file {path} is truncated or altered" in note
    train(resumed)
    same_results(resumed, reference)  # from the older checkpoint (or round 0): the same run


def spill_files_of(folder: Path, payload: dict) -> list:
    """The client-state files a checkpoint's ``payload`` names, in its ``folder``."""
    return [folder / "client-state" / f"{c['stored_in']['digest']}.safetensors"
            for c in payload["server"]["clients"] if "stored_in" in c]


def test_too_small_a_budget_on_resume_keeps_the_checkpoint_and_says_to_raise_it(data_dir, tmp_path):
    """The checkpoint is sound; what fails is --state_memory: the line names the budget, tells to raise
    it, and never to delete the checkpoint, which then resumes with a budget that fits."""
    from utils.checkpoint import CheckpointError
    reference, budget, results, folder = killed_spilling_run(data_dir, tmp_path)
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError) as refused:
        server_for(data_dir, results, *SPILLING, "--state_memory", "1", "--resume")
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "round_000002.pt" in message
    assert "--state_memory 1 B cannot hold one client's own state" in message and "raise --state_memory" in message
    assert "rerun with --resume" in message and "delete" not in message
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before  # nothing lost
    resumed = server_for(data_dir, results, *SPILLING, "--state_memory", budget, "--resume")
    train(resumed)
    same_results(resumed, reference)


def test_with_every_client_state_file_altered_the_fresh_start_completes(data_dir, tmp_path, capsys):
    """Every file the kept checkpoints (rounds 1 and 3) name altered in place, same size: both are refused
    and the run starts from round 0. Its round 1 spills the same states again, before any checkpoint
    could prune the altered files: each is rewritten, not taken for the file of its name, so the run
    completes with the uninterrupted run's results."""
    flags = (*SPILLING, "--checkpoint_every", "2")
    reference, budget, results, folder = killed_spilling_run(data_dir, tmp_path, flags, killed_in=4)
    named = [spill_files_of(folder, torch.load(path, weights_only=True)) for path in sorted(folder.glob("*.pt"))]
    assert len(named) == 2 and all(named), "each kept checkpoint must name a spilled client's file"
    for path in (folder / "client-state").glob("*.safetensors"):
        data = bytearray(path.read_bytes())
        data[-4:] = bytes(b ^ 0xFF for b in data[-4:])
        path.write_bytes(bytes(data))
    resumed = server_for(data_dir, results, *flags, "--state_memory", budget, "--resume")
    note = capsys.readouterr().out
    assert "no usable checkpoint" in note and "starting from round 0" in note
    train(resumed)
    same_results(resumed, reference)
    assert not (results / "checkpoints").exists()


def test_a_folder_at_a_checkpointed_files_name_is_named_in_one_line_and_the_run_resumes_once_moved(
        data_dir, tmp_path, capsys):
    """A folder where a file both kept checkpoints name should be: each is refused for it, the fresh start
    leaves the folder alone and stops, in one line, where it needs the name; once the folder is moved,
    --resume continues from the fresh start's checkpoint to the uninterrupted run's results."""
    from utils.errors import RunError
    reference, budget, results, folder = killed_spilling_run(data_dir, tmp_path, killed_in=4)
    named = [set(spill_files_of(folder, torch.load(p, weights_only=True))) for p in folder.glob("*.pt")]
    # Of the files both name, the one a fresh start first needs last (the same run elsewhere says when each
    # is first written): the fresh start then stops on it after a checkpoint of its own.
    first_written: list = []
    probe = server_for(data_dir, tmp_path / "probe", *SPILLING, "--state_memory", budget)
    write = probe.state_store.files.write

    def spy(tensors):
        record = write(tensors)
        if record.digest not in first_written:
            first_written.append(record.digest)
        return record
    probe.state_store.files.write = spy
    train(probe)
    path = max(set.intersection(*named), key=lambda p: first_written.index(p.name[:64]))
    path.unlink()
    path.mkdir()
    (path / "notes.txt").write_text("someone's")
    resumed = server_for(data_dir, results, *SPILLING, "--state_memory", budget, "--resume")
    assert "starting from round 0" in capsys.readouterr().out
    with pytest.raises(RunError) as stop:
        train(resumed)
    message = str(stop.value)
    assert len(message.splitlines()) == 1 and f"{path} is a folder" in message and "move it away" in message
    assert (path / "notes.txt").read_text() == "someone's"
    path.rename(tmp_path / "moved")
    again = server_for(data_dir, results, *SPILLING, "--state_memory", budget, "--resume")
    assert "resumed after round" in capsys.readouterr().out
    train(again)
    same_results(again, reference)


def test_a_full_disk_while_spilling_stops_the_run_in_one_line_keeping_results(data_dir, tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError
    from utils.errors import RunError
    budget = spilling_budget(data_dir, tmp_path)
    server = server_for(data_dir, tmp_path / "full", *SPILLING, "--state_memory", budget)

    def full_disk(tensors, path):  # what safetensors raises when the disk fills under it
        Path(path).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(RunError) as stop:
        train(server)
    message = str(stop.value)
    assert len(message.splitlines()) == 1 and "cannot write a client's state to" in message
    assert "No space left on device" in message and "Results so far kept in" in message
    assert read_results(results_file(server))[0]["rs_test_acc"].size >= 1
    folder = server.state_store.files.folder
    assert not (folder.is_dir() and any(folder.glob(".spill.*")))  # the partial file went


def test_a_store_folder_that_cannot_be_made_stops_the_run_in_one_line(data_dir, tmp_path):
    budget = spilling_budget(data_dir, tmp_path)
    server = server_for(data_dir, tmp_path / "blocked", *SPILLING, "--state_memory", budget)
    run_of(server)  # the run puts the store under its checkpoint folder
    server.state_store.files.folder.parent.mkdir(parents=True)
    server.state_store.files.folder.write_text("a file where the store's folder goes")
    from utils.errors import RunError
    with pytest.raises(RunError, match="cannot write a client's state to"):
        train(server)


# ----- every executor reads spilled clients back -----------------------------------------------------
def test_the_batched_engine_reads_spilled_clients_back(data_dir, tmp_path):
    flags = ("-algo", "FedPer", "-gr", "3", "-jr", "0.5", "--executor", "batched")
    kept = server_for(data_dir, tmp_path / "kept", *flags)
    train(kept)
    budget = str(2 * max(c.own_bytes() for c in kept.clients) + 1)
    spilled = server_for(data_dir, tmp_path / "spilled", *flags, "--state_memory", budget)
    train(spilled)
    assert spilled.state_store.files.read_back > 0
    same_results(spilled, kept)


@pytest.mark.xdist_group("ray")  # the worker that runs the other Ray tests
def test_ray_workers_get_spilled_clients_read_back(ray_session, data_dir, tmp_path):
    flags = ("-algo", "SCAFFOLD", "-gr", "3", "-jr", "0.5", "--workers", "2")
    kept = server_for(data_dir, tmp_path / "kept", *flags)
    train(kept)
    budget = str(2 * max(c.own_bytes() for c in kept.clients) + 1)
    spilled = server_for(data_dir, tmp_path / "spilled", *flags, "--executor", "ray", "--state_memory", budget)
    train(spilled)
    assert spilled.state_store.files.read_back > 0
    same_results(spilled, kept)


def test_new_clients_use_the_store_too(data_dir, tmp_path):
    flags = ("-algo", "Ditto", "-nc", "4", "-nnc", "2", "-gr", "2", "-ften", "1")
    kept = server_for(data_dir, tmp_path / "kept", *flags)
    train(kept)
    budget = str(2 * max(c.own_bytes() for c in kept.clients + kept.new_clients) + 1)
    spilled = server_for(data_dir, tmp_path / "spilled", *flags, "--state_memory", budget)
    train(spilled)
    assert all(c._store is spilled.state_store for c in spilled.new_clients)
    same_results(spilled, kept)
