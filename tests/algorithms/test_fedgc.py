"""FedGC: the body averaged, a head of class embeddings per client over its own classes, and the server's
cross-client correction of every head, by hand; X+LAG; what a newcomer gets."""
import math

import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.training.gradient_correction import corrected_embeddings, cross_client_regulariser
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, uploads_are

# Client 0 holds classes 0 and 1, client 1 holds 0 and 2 (rows of classes a client lacks must not matter).
EMBEDDINGS = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]],
                           [[1.0, 1.0], [9.0, 9.0], [-1.0, 0.0]]])
HELD = torch.tensor([[True, True, False], [True, False, True]])


def test_regulariser_contrasts_each_class_embedding_with_the_other_clients_other_classes():
    e = math.e
    # Anchor (client, class): its own e^{a.a} against e^{a.w} of the other client's held rows of other classes.
    terms = [math.log(e + e ** -1) - 1,            # (0, 0) = (1, 0) against (1, 2) = (-1, 0)
             math.log(e + e + 1) - 1,              # (0, 1) = (0, 1) against (1, 0) = (1, 1) and (1, 2)
             math.log(e ** 2 + e) - 2,             # (1, 0) = (1, 1) against (0, 1) only: (0, 0) is its own class
             math.log(e + e ** -1 + 1) - 1]        # (1, 2) = (-1, 0) against (0, 0) and (0, 1)
    weights = EMBEDDINGS.clone().requires_grad_(True)
    value = cross_client_regulariser(weights, HELD)
    assert value.item() == pytest.approx(sum(terms), rel=1e-6)
    gradient, = torch.autograd.grad(value, weights)
    # Only negatives move, by the softmax weight of each anchor that counts them times that anchor: the
    # cross-client term of a softmax over every class, with the embedding standing in for its features.
    expected = torch.zeros_like(EMBEDDINGS)
    expected[1, 2] = e ** -1 / (e + e ** -1) * torch.tensor([1.0, 0.0]) + 1 / (2 * e + 1) * torch.tensor([0.0, 1.0])
    expected[1, 0] = e / (2 * e + 1) * torch.tensor([0.0, 1.0])
    expected[0, 0] = e ** -1 / (e + e ** -1 + 1) * torch.tensor([-1.0, 0.0])
    expected[0, 1] = e / (e ** 2 + e) * torch.tensor([1.0, 1.0]) + 1 / (e + e ** -1 + 1) * torch.tensor([-1.0, 0.0])
    assert torch.allclose(gradient, expected, atol=1e-6)
    step = corrected_embeddings(EMBEDDINGS, HELD, 0.5)
    assert torch.allclose(step, EMBEDDINGS - 0.5 * expected, atol=1e-6)
    assert torch.equal(corrected_embeddings(EMBEDDINGS, HELD, 0.0), EMBEDDINGS)


def test_local_training_is_a_softmax_over_the_clients_own_classes(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGC")
    client = in_use(next(c for c in server.clients if not bool(c.held_classes.all())))
    assert client.model.head.bias is None  # a head of class embeddings
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    held = client.held_classes
    logits = client.model(x)
    expected = -F.log_softmax(logits[:, held], dim=1)[torch.arange(12), torch.cumsum(held, 0)[y] - 1].mean()
    assert client.local_loss(x, y).item() == pytest.approx(expected.item(), rel=1e-6)
    before = client.model.head.weight.detach().clone()
    client.train()
    after = client.model.head.weight.detach()
    assert torch.equal(after[~held], before[~held]) and not torch.equal(after[held], before[held])
    predicted = client.evaluation_model()(client.test_data.x).argmax(dim=1)
    assert bool(held[predicted].all())  # a class the client lacks is never predicted


def test_body_is_averaged_and_each_head_comes_back_corrected_by_the_server(data_dir, tmp_path):
    lamda, lr = 2.0, 0.05
    server = server_for(data_dir, tmp_path, "-algo", "FedGC", "-jr", "0.5", "-lam", str(lamda))
    before = server.class_embeddings.clone()
    play_round(server)
    assert uploads_are(server, lambda client: in_use(client).model.base)  # the head never travels as a shared tensor
    uploaded = before.clone()
    for update in server.uploads:
        uploaded[update.client_id] = update.extras["class_embeddings"]
    expected = corrected_embeddings(uploaded, server.held_classes, lamda * lr)
    assert torch.allclose(server.class_embeddings, expected, atol=1e-7)
    assert not torch.allclose(server.class_embeddings, uploaded, atol=1e-4)  # the correction moved them
    server.send_models()
    for client in server.clients:
        client.check_out()
        assert torch.equal(client.model.head.weight, server.class_embeddings[client.id])
        assert state_equal(named_tensors(client.model.base), named_tensors(server.global_model.base))


def test_a_head_that_is_not_finite_is_left_out(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGC", "-jr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    victim = server.selected_clients[0]
    poisoned = server.trained_updates[victim.id].extras["class_embeddings"].clone()
    poisoned[0, 0] = float("nan")
    server.trained_updates[victim.id].extras["class_embeddings"] = poisoned
    server.receive_models()
    assert victim.id not in server.uploader_ids()
    assert "class embeddings hold a NaN" in server.rejected_updates[0]["reason"]


def test_fedgc_lag_personalises_body_tensors_and_the_server_still_sends_each_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGC+LAG", "-m", "CNN", "-jr", "0.5", "--lag_top_k", "3")
    personal = assert_lag_composes(server, k=2, sent_back={"head.weight"})  # + its one head tensor
    assert all(name.startswith("base.") for name in personal)
    for client in server.clients:
        assert torch.equal(client.model.head.weight, server.class_embeddings[client.id])


def test_newcomer_gets_the_global_body_and_a_fresh_head_over_its_own_classes(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGC", "-nc", "4", "-nnc", "1", "-gr", "1", "-ften", "0")
    initial_head = server.clients[0].module_tensors()["head.weight"].detach().clone()
    for _ in range(2):
        play_round(server)
    newcomer = in_use(server.set_clients([4])[0])
    server.receive_new_client(newcomer)
    assert state_equal(named_tensors(newcomer.model.base), named_tensors(server.global_model.base))
    assert torch.equal(newcomer.model.head.weight, initial_head)
    newcomer.fine_tune(1)
    held, head = newcomer.held_classes, newcomer.model.head.weight.detach()
    assert torch.equal(head[~held], initial_head[~held]) and not torch.equal(head[held], initial_head[held])
