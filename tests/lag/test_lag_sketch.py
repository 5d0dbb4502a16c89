"""``--lag_upload sketch``: clients keep their personal layers and upload a count sketch of each one's update,
which the server scores in place of the update."""
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.lag import LagError, LagSettings
from flcore.lag.sketch import count_sketch, sketch_map, sketch_size
from helpers import play_round, server_for


def test_count_sketch_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, -1.0, 2.0]], dtype=torch.float64)
    buckets, signs = torch.tensor([0, 1, 0, 2]), torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    expected = torch.tensor([[1 + 3, -2, -4], [0.5 - 1, 0, -2]], dtype=torch.float64)
    assert torch.equal(count_sketch(values, buckets, signs, 3), expected)


def test_a_sketch_as_large_as_its_layer_is_a_signed_permutation_and_keeps_every_inner_product():
    buckets, signs = sketch_map(50, 50, seed=3, layer=1)
    assert sorted(buckets.tolist()) == list(range(50)) and set(signs.tolist()) == {-1.0, 1.0}
    values = torch.randn(6, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sketches = count_sketch(values, buckets, signs, 50)
    torch.testing.assert_close(sketches @ sketches.T, values @ values.T, rtol=0, atol=1e-12)


def test_sketched_inner_products_are_unbiased_over_the_draws_of_the_map():
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(200, dtype=torch.float64, generator=generator)
    b = 0.6 * a + torch.randn(200, dtype=torch.float64, generator=generator)
    products = []
    for seed in range(3000):
        buckets, signs = sketch_map(200, 16, seed=seed, layer=0)
        s = count_sketch(torch.stack([a, b]), buckets, signs, 16)
        products.append(float(s[0] @ s[1]))
    products = torch.tensor(products, dtype=torch.float64)
    standard_error = float(products.std()) / len(products) ** 0.5
    assert abs(float(products.mean()) - float(a @ b)) < 4 * standard_error
    assert float(products.std()) > 0.1 * abs(float(a @ b))  # 16 numbers of 200 are an estimate, not the value


def test_the_map_depends_on_the_run_seed_and_the_layer_only():
    first = sketch_map(100, 10, seed=7, layer=2)
    assert all(torch.equal(x, y) for x, y in zip(first, sketch_map(100, 10, seed=7, layer=2)))
    assert not torch.equal(first[0], sketch_map(100, 10, seed=7, layer=3)[0])
    assert not torch.equal(first[0], sketch_map(100, 10, seed=8, layer=2)[0])


def test_a_sketch_never_holds_more_than_a_quarter_of_its_layer():
    assert sketch_size(330, 64) == 64 and sketch_size(100, 64) == 25 and sketch_size(3, 64) == 1


def test_personal_layers_leave_the_uploads_and_their_sketches_are_scored(data_dir, tmp_path):
    """Round 1, once a layer is personal: the sketching server's uploads carry none of its tensors, its update
    matrix holds the count sketch of the update the uploading twin scores (the same training: a personal
    layer is never broadcast, so what a client holds of it is its own either way), the global model's copy of
    it is not averaged, and every shared tensor comes out the same."""
    flags = ("-algo", "FedLAG", "--lag_top_k", "1", "--seed", "3", "--lag_granularity", "module")
    sketching = server_for(data_dir, tmp_path / "sketch", *flags, "--lag_upload", "sketch", "--lag_sketch_dim", "4")
    uploading = server_for(data_dir, tmp_path / "all", *flags)
    for server in (sketching, uploading):
        play_round(server)
    assert sketching.lag_personal == uploading.lag_personal and len(sketching.lag_personal) == 1
    layer = sketching.lag_personal[0]
    personal = set(sketching.lag_personal_names())
    before = {n: t.clone() for n, t in named_tensors(sketching.global_model).items()}
    for server in (sketching, uploading):
        server.selected_clients = server.select_clients()
        server.send_models()
        server.train_clients(server.selected_clients)
        server.receive_models()
    assert sketching.uploads and all(not personal & {u.full_name(n) for n in u.tensors} for u in sketching.uploads)
    assert all(personal <= {u.full_name(n) for n in u.tensors} for u in uploading.uploads)
    rows = [sketching.lag_updates.scored[u.client_id] for u in sketching.uploads]
    spans = sketching.lag_updates.spans[layer]
    got = torch.cat([sketching.lag_updates.matrix[rows, a:b] for a, b in spans], dim=1)
    updates = uploading.lag_updates.layer_updates([layer], [uploading.lag_updates.scored[u.client_id]
                                                            for u in sketching.uploads])[layer]
    size = updates.shape[1]
    dim = sketch_size(size, 4)
    assert dim == 4 and size > dim
    buckets, signs = sketch_map(size, dim, seed=3, layer=layer)
    assert torch.equal(got[:, :dim], count_sketch(updates, buckets, signs, dim))
    assert not got[:, dim:].any()
    for server in (sketching, uploading):
        server.aggregate_parameters()
    after = named_tensors(sketching.global_model)
    assert all(torch.equal(after[n], before[n]) for n in personal)
    assert not all(torch.equal(named_tensors(uploading.global_model)[n], before[n]) for n in personal)
    assert all(torch.equal(after[n], t) for n, t in named_tensors(uploading.global_model).items() if n not in personal)


def test_sketching_is_refused_where_the_personal_layers_must_reach_the_server(data_dir, tmp_path):
    for share in ("groups", "check"):
        assert any("--lag_upload sketch" in p for p in LagSettings(upload="sketch", share=share).problems())
    assert not LagSettings(upload="sketch").problems()
    with pytest.raises(LagError, match="FedKD needs them"):
        server_for(data_dir, tmp_path, "-algo", "FedKD+LAG", "--lag_upload", "sketch")
