"""FedGen: the ensemble of uploaded heads by hand, a generator the heads agree with, the clients' term on
generated features, label counts, -lf, X+LAG, state and what a newcomer gets."""
import copy

import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.servers.servergen import head_function
from flcore.training.feature_generator import draw_labels_and_noise, ensemble_logits, label_shares
from helpers import (assert_lag_composes, in_use, original_and_restored_twin, play_round, server_for, state_equal,
                     upload_current_state, uploads_are)


def test_the_ensemble_weighs_each_head_by_its_share_of_the_label():
    counts = torch.tensor([[3, 0, 1], [1, 2, 0]])
    shares = label_shares(counts)
    assert torch.allclose(shares, torch.tensor([[0.75, 0.0, 1.0], [0.25, 1.0, 0.0]]))
    first, second = (lambda z: z * 1.0), (lambda z: z * 10.0)
    features = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    logits = ensemble_logits([first, second], shares, features, torch.tensor([0, 1]))
    # Sample 0 (label 0): 0.75 of the first head + 0.25 of the second; sample 1 (label 1): the second alone.
    assert torch.allclose(logits, torch.tensor([[3.25, 6.5, 9.75], [10.0, 10.0, 10.0]]))
    assert torch.equal(label_shares(torch.zeros(2, 3, dtype=torch.int64)), torch.zeros(2, 3))


def generated_accuracy(server, heads, shares, distribution) -> float:
    """How often the ensemble of ``heads`` classifies the server generator's features as their label."""
    rng = torch.Generator().manual_seed(5)
    labels, noise = draw_labels_and_noise(distribution, 400, server.hparams.noise_dim, rng, server.device)
    server.feature_generator.eval()
    with torch.no_grad():
        logits = ensemble_logits(heads, shares, server.feature_generator(noise, labels), labels)
    return float((logits.argmax(dim=1) == labels).float().mean())


def test_the_server_trains_its_generator_until_the_uploaded_heads_agree_on_the_label(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen", "-jr", "1", "-se", "200", "-glr", "0.01")
    untrained = copy.deepcopy(server.feature_generator.state_dict())
    server.selected_clients = server.select_clients()
    server.send_models()
    assert all(c.feature_generator is None for c in server.clients)  # nothing to learn from before round 0
    server.train_clients(server.selected_clients)
    server.receive_models()
    template = copy.deepcopy(server.global_model.head).eval()
    heads = [head_function(template, u) for u in server.uploads]
    counts = torch.stack([u.extras["label_counts"] for u in server.uploads])
    shares, distribution = label_shares(counts), counts.sum(0)
    before = generated_accuracy(server, heads, shares, distribution)
    server.aggregate_parameters()
    assert server.generator_trained
    after = generated_accuracy(server, heads, shares, distribution)
    assert after > 0.95 and after > before + 0.3, (before, after)
    assert not state_equal(named_tensors(server.feature_generator), untrained)
    # The global model is still FedAvg's average.
    weights = server.upload_weights
    for name, value in named_tensors(server.global_model).items():
        if value.is_floating_point():
            expected = sum(w * u.tensors[name] for w, u in zip(weights, server.uploads))
            assert torch.allclose(value, expected, atol=1e-6), name


def test_clients_add_the_heads_cross_entropy_on_generated_features_from_round_one(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen", "-jr", "0.5")
    play_round(server)
    server.send_models()
    client = in_use(server.clients[0])
    generator = client.feature_generator
    assert generator is not None and not generator.training
    assert not any(p.requires_grad for p in generator.parameters())
    total = server.label_counts.sum(0).double()
    assert torch.allclose(client.label_distribution, total / total.sum())
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    state = client.generator.get_state()
    loss = client.local_loss(x, y)
    replay = torch.Generator()
    replay.set_state(state)
    labels, noise = draw_labels_and_noise(client.label_distribution, client.batch_size, generator.noise_dim, replay,
                                          y.device)
    with torch.no_grad():
        expected = F.cross_entropy(client.model(x), y) + F.cross_entropy(client.model.head(generator(noise, labels)),
                                                                         labels)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert loss.item() != pytest.approx(F.cross_entropy(client.model(x), y).item(), rel=1e-3)
    assert torch.equal(client.generator.get_state(), replay.get_state())


def test_uploads_carry_label_counts_and_wrong_counts_are_left_out(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen", "-jr", "0.5")
    play_round(server)
    for update in server.uploads:
        client = server.clients[update.client_id]
        expected = torch.bincount(client.train_data.y, minlength=server.num_classes)
        assert torch.equal(server.label_counts[update.client_id], expected)
    silent = set(range(len(server.clients))) - set(server.uploader_ids())
    assert all(int(server.label_counts[i].sum()) == 0 for i in silent)
    server.selected_clients = server.select_clients()
    liar = server.selected_clients[0]
    liar.label_counts = liar.label_counts * 2
    upload_current_state(server)
    server.receive_models()
    assert liar.id not in server.uploader_ids()
    assert "do not add up" in server.rejected_updates[-1]["reason"]


def test_localized_feature_extractor_shares_the_head_only(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen", "-lf", "True", "-jr", "0.5")
    initial_base = copy.deepcopy(named_tensors(server.global_model.base))
    play_round(server)
    assert uploads_are(server, lambda client: in_use(client).model.head) and server.generator_trained
    assert state_equal(named_tensors(server.global_model.base), initial_base)
    bases = {c.id: copy.deepcopy(named_tensors(in_use(c).model.base)) for c in server.clients}
    server.send_models()
    for client in server.clients:
        client.check_out()
        assert state_equal(named_tensors(client.model.base), bases[client.id])
        assert state_equal(named_tensors(client.model.head), named_tensors(server.global_model.head))


def test_lag_composes_with_fedgen(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen+LAG", "-m", "CNN", "-jr", "0.5", "--lag_top_k", "2")
    assert_lag_composes(server, k=2)
    assert server.generator_trained


def test_a_server_restored_from_state_continues_exactly(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "FedGen", "-jr", "0.5")
    assert state_equal(named_tensors(original.global_model), named_tensors(twin.global_model))
    assert state_equal(named_tensors(original.feature_generator), named_tensors(twin.feature_generator))
    assert torch.equal(original.noise_generator.get_state(), twin.noise_generator.get_state())


def test_newcomer_gets_the_global_model_and_the_generator_and_fine_tunes_with_it(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGen", "-nc", "4", "-nnc", "1", "-gr", "1")
    play_round(server)
    newcomer = in_use(server.set_clients([4])[0])
    server.receive_new_client(newcomer)
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    assert state_equal(named_tensors(newcomer.feature_generator), named_tensors(server.feature_generator))
    seen = []
    hook = newcomer.model.head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    newcomer.fine_tune(1)
    hook.remove()
    # At every step the head reads the real batch's features and as many generated ones.
    generated = seen[1::2]
    assert len(seen) == 2 * len(generated) and generated
    assert all(z.shape == (newcomer.batch_size, newcomer.model.head.in_features) for z in generated)
