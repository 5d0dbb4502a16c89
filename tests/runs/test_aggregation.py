"""Weighted averaging by name, against hand computations."""
import pytest
import torch
from torch import nn

from flcore.aggregation import copy_into, sample_weights, weighted_average
from helpers import in_use, server_for, upload_current_state, uploads_are


def test_weighted_average_matches_hand_computation():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "steps": torch.tensor(5)}
    out = weighted_average([a, b], [0.25, 0.75])
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))  # 0.25*1+0.75*3, 0.25*2+0.75*6
    assert out["steps"].item() == 5  # counters keep the largest, never a fraction


def test_weighted_average_can_be_restricted_to_names():
    a = {"w": torch.ones(2), "bn": torch.ones(2)}
    out = weighted_average([a, a], [0.5, 0.5], names=["w"])
    assert list(out) == ["w"]


def test_sample_weights():
    assert sample_weights([10, 30]) == [0.25, 0.75]
    assert sample_weights([0, 0]) == [0.5, 0.5]


def test_copy_into_is_in_place_and_rejects_unknown_names():
    model = nn.Linear(2, 1)
    weight = model.weight
    copy_into(model, {"weight": torch.full((1, 2), 7.0)})
    assert model.weight is weight and torch.equal(weight, torch.full((1, 2), 7.0))
    with pytest.raises(KeyError, match="nope"):
        copy_into(model, {"nope": torch.zeros(1)})


def test_fedavg_server_averages_uploads_by_train_samples(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-gr", "0")
    server.selected_clients = server.clients[:2]
    for value, client in zip((1.0, 4.0), server.selected_clients):
        with torch.no_grad():
            for p in in_use(client).model.parameters():
                p.fill_(value)
    upload_current_state(server)
    server.receive_models()
    server.aggregate_parameters()
    n0, n1 = (c.train_samples for c in server.selected_clients)
    expected = (1.0 * n0 + 4.0 * n1) / (n0 + n1)
    for name, p in server.global_model.named_parameters():
        assert torch.allclose(p, torch.full_like(p, expected)), name
    assert server.uploader_ids() == [c.id for c in server.selected_clients]
    assert uploads_are(server, lambda c: in_use(c).model)  # views of the clients' tensors: no copy per upload
