"""Run state survives export and import: continuing from a copy equals continuing the original."""
import numpy as np
import torch

from flcore.state import export_value, import_value
from helpers import in_use, play_round, server_for


def test_export_import_round_trip_of_plain_values():
    value = {"a": torch.arange(3), "b": [1, 2.5, "x", None], "c": (1, 2), "d": np.ones(2)}
    back = import_value(None, export_value(value))
    assert torch.equal(back["a"], value["a"]) and back["b"] == value["b"] and back["c"] == (1, 2)
    assert np.array_equal(back["d"], value["d"])


def test_generators_resume_their_streams():
    torch_gen, np_gen = torch.Generator().manual_seed(3), np.random.default_rng(3)
    saved = export_value([torch_gen, np_gen])
    expected = (torch.randn(3, generator=torch_gen), np_gen.random(3))
    fresh_torch, fresh_np = torch.Generator(), np.random.default_rng(0)
    import_value(fresh_torch, saved[0])
    import_value(fresh_np, saved[1])
    assert torch.equal(torch.randn(3, generator=fresh_torch), expected[0])
    assert np.array_equal(fresh_np.random(3), expected[1])


def test_a_server_loaded_from_state_continues_exactly_like_the_original(data_dir, tmp_path):
    for algorithm in ("FedAvg", "FedLAG"):
        original = server_for(data_dir, tmp_path, "-algo", algorithm, "-jr", "0.5", "-m", "CNN", "--lag_top_k", "2")
        play_round(original)
        torch.save(original.get_state(), tmp_path / "state.pt")
        saved = torch.load(tmp_path / "state.pt", weights_only=True)  # no arbitrary pickle needed
        twin = server_for(data_dir, tmp_path, "-algo", algorithm, "-jr", "0.5", "-m", "CNN", "--lag_top_k", "2",
                          "--seed", "7")
        twin.set_state(saved)
        for _ in range(2):  # the second round uses the personal set chosen after the load
            play_round(original)
            play_round(twin)
            if algorithm == "FedLAG":
                assert twin.lag_personal == original.lag_personal and len(twin.lag_personal) == 2
        for a, b in zip(original.clients, twin.clients):
            for (name, p), q in zip(in_use(a).model.named_parameters(), in_use(b).model.parameters()):
                assert torch.equal(p, q), (algorithm, a.id, name)
        assert [c.id for c in original.selected_clients] == [c.id for c in twin.selected_clients]
