"""Every update is checked at the edge before it is averaged: what was shared (names, shapes, dtypes),
finite values, a plausible sample count. One bad client is left out of the round, never averaged; the
run goes on and says so."""
from dataclasses import replace

import pytest
import torch

from flcore.aggregation import sample_weights, weighted_average
from flcore.exchange import magnitude_limit, update_problem
from helpers import results_file, server_for, server_of_class, train
from utils.result_utils import read_results


def poison(kind: str, update):
    """``update`` with one defect of kind ``kind``."""
    tensors = {n: t.clone() for n, t in update.tensors.items()}
    name = next(iter(tensors))
    if kind == "nan":
        tensors[name].view(-1)[0] = float("nan")
    elif kind == "infinite":
        tensors[name].view(-1)[0] = float("inf")
    elif kind == "huge":
        tensors[name].view(-1)[0] = 1e30
    elif kind == "shape":
        tensors[name] = torch.zeros(3, 3)
    elif kind == "dtype":
        tensors[name] = tensors[name].double()
    elif kind == "missing":
        del tensors[name]
    elif kind == "extra":
        tensors["evil.weight"] = torch.zeros(1)
    samples = {"samples_huge": 10 ** 9, "samples_zero": 0, "samples_negative": -3, "samples_fraction": 2.5,
               "samples_bool": True}.get(kind, update.num_samples)
    return replace(update, tensors=tensors, num_samples=samples)


KINDS = ["nan", "infinite", "huge", "shape", "dtype", "missing", "extra", "samples_huge", "samples_zero", "samples_negative",
         "samples_fraction", "samples_bool"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_update_is_left_out_and_the_rest_averaged(kind, data_dir, tmp_path, capsys):
    server = server_for(data_dir, tmp_path, "-nc", "6", "-jr", "1")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    victim = server.selected_clients[0].id
    server.trained_updates[victim] = poison(kind, server.trained_updates[victim])
    others = [server.trained_updates[c.id] for c in server.selected_clients if c.id != victim]
    server.receive_models()
    assert victim not in server.uploader_ids() and len(server.uploads) == len(others)
    assert server.rejected_updates == [{"round": 0, "client": victim, "reason": server.rejected_updates[0]["reason"]}]
    assert f"the update of client {victim} is left out of the average" in capsys.readouterr().err
    server.aggregate_parameters()
    expected = weighted_average([u.tensors for u in others], sample_weights([u.num_samples for u in others]))
    for name, tensor in server.global_model.state_dict().items():
        if name in expected and tensor.is_floating_point():
            assert torch.allclose(tensor, expected[name]), name


def test_each_kind_of_defect_is_named():
    spec = {"w": ((2,), torch.float32), "b": ((1,), torch.float32)}
    good = {"w": torch.ones(2), "b": torch.zeros(1)}
    assert update_problem(good, spec, 5, 10) is None
    assert "missing b" in update_problem({"w": torch.ones(2)}, spec, 5)
    assert "unexpected x" in update_problem(dict(good, x=torch.ones(1)), spec, 5)
    assert "shape (3,)" in update_problem(dict(good, w=torch.ones(3)), spec, 5)
    assert "NaN or infinite" in update_problem(dict(good, b=torch.tensor([float("inf")])), spec, 5)
    assert "above the 10 training samples" in update_problem(good, spec, 11, 10)
    assert "not a whole number" in update_problem(good, spec, 0)
    assert "gradient w holds a NaN" in update_problem(good, spec, 5, gradients={"w": torch.tensor([1.0, float("nan")])})
    limit = magnitude_limit({"w": torch.tensor([0.5, -2.0])})           # 1e6 * (1 + 2)
    assert limit == 3e6
    assert update_problem(dict(good, w=torch.tensor([2.9e6, 0.0])), spec, 5, limit=limit) is None
    assert "beyond 3e+06" in update_problem(dict(good, w=torch.tensor([3.1e6, 0.0])), spec, 5, limit=limit)


def test_a_client_that_poisons_every_round_cannot_stop_or_poison_the_run(data_dir, tmp_path, capsys):
    from flcore.servers.serveravg import FedAvg

    class Poisoner(FedAvg.client_class):
        def upload(self):
            update = super().upload()
            return poison("nan", update) if self.id == 2 else update

    class PoisonedFedAvg(FedAvg):
        client_class = Poisoner

    server = server_of_class(PoisonedFedAvg, data_dir, tmp_path, "-nc", "6", "-jr", "1", "-gr", "2")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and [r["client"] for r in attrs["rejected_updates"]] == [2, 2, 2]
    assert all(torch.isfinite(t).all() for t in server.global_model.state_dict().values() if t.is_floating_point())
    assert capsys.readouterr().err.count("the update of client 2 is left out") == 3
