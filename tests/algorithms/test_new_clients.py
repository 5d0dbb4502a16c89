"""Clients never seen in training (-nnc, -ften): every algorithm evaluates them, and each gives a newcomer
what its method implies (the defining part of every group: global model, shared body with a fresh
personal part, personalised copies, the cluster model of lowest loss, knowledge sharing, FedLAG and X+LAG).

Most runs use -ften 0, so a newcomer's model after the run is exactly what it received."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flcore.clients.clientfd as clientfd
import flcore.clients.clientproto as clientproto
from flcore.aggregation import named_tensors
from flcore.registry import valid_names
from flcore.training.classvectors import ClassVectors
from app.build import build_server, hyperparameters, prepare
from app.options import parse_args
from utils.result_utils import read_results
from helpers import in_use, cli, method_flags, server_for, state_equal, train, training_loss_of, results_file

def snapshot(module: torch.nn.Module) -> dict:
    return {n: t.detach().clone() for n, t in named_tensors(module).items()}


def trained_with_newcomer(data_dir, tmp_path, name: str, *extra: str, ften: int = 0):
    """A run of ``name`` on 4 clients, 2 rounds, then client 4 as a newcomer fine-tuned ``ften`` epochs;
    returns the server, the newcomer and the model every client started from."""
    server = server_for(data_dir, tmp_path, "-algo", name, "-nc", "4", "-nnc", "1", "-ften", str(ften), "-gr", "1",
                        *method_flags(name), *extra)
    initial = snapshot(in_use(server.clients[0]).model)
    train(server)
    assert [c.id for c in server.new_clients] == [4]
    for client in server.clients:  # the tests read every client's modules
        in_use(client)
    return server, in_use(server.new_clients[0]), initial


def differs_from_every_trained_client(newcomer, server, names) -> bool:
    """Whether the newcomer's tensors ``names`` differ from those of each training client."""
    mine = named_tensors(newcomer.model)
    return all(not state_equal(mine, named_tensors(in_use(c).model), names) for c in server.clients)


# ----- every algorithm: -nnc runs and reports sensible numbers ------------------------------------------
@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """The embedded Digits split for 5 clients (4 training + 1 new), built once under a temporary folder."""
    return tmp_path_factory.mktemp("digits")


@pytest.mark.parametrize("name", valid_names())
def test_every_algorithm_fine_tunes_and_reports_a_new_client(digits_dir, tmp_path, name):
    flags = ["-algo", name, "-data", "Digits", "-nc", "4", "-nnc", "1", "-ften", "1", "-gr", "1", "-dev", "cpu",
             "-m", "DNN", "-lr", "0.05", "--data_dir", str(digits_dir), "--results_dir", str(tmp_path),
             "--lag_granularity", "tensor", *method_flags(name)]
    config, _ = prepare(parse_args(flags))
    server = build_server(config, 0)
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert arrays["rs_new_test_acc"].shape == (1,) and arrays["rs_new_client_acc"].shape == (1, 1)
    assert np.isfinite(arrays["rs_new_train_loss"]).all()
    # The newcomer holds mostly two digits; one epoch on them from what its method gives it beats chance
    # (0.1) and its majority digit (0.39) by far. (A FedProto newcomer classified by the global prototypes
    # alone scores 0.24 here: no training client holds its two main digits, so they have none.)
    assert arrays["rs_new_test_acc"][0] > 0.5, arrays["rs_new_test_acc"]
    assert 0.5 < arrays["rs_new_test_auc"][0] <= 1.0
    assert [c.id for c in server.new_clients] == [4] and len(server.clients) == 4


# ----- global-model methods: the global model, whole ---------------------------------------------------
@pytest.mark.parametrize("name", ["FedAvg", "FedProx", "FedDyn", "MOON", "SCAFFOLD", "FedNTD", "FedLC", "FedALA",
                                  "FedCAC", "PerAvg", "FedBN"])
def test_global_model_methods_give_a_newcomer_the_global_model(data_dir, tmp_path, name):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, name)
    every = named_tensors(newcomer.model)
    # (FedBN on this model, which has no normalisation layer, is FedAvg.)
    assert state_equal(every, named_tensors(server.global_model))
    # Not any training client's model (each holds its own last local training).
    assert differs_from_every_trained_client(newcomer, server, list(every))


def test_fine_tuning_moves_the_newcomer_from_the_global_model(data_dir, tmp_path):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, "FedAvg", ften=1)
    assert not state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))


# ----- body-shared methods: the shared part from the server, a fresh personal part ---------------------
@pytest.mark.parametrize("name,extra", [("FedPer", ()), ("FedRep", ()), ("FedBABU", ()), ("FedPAC", ()),
                                        ("FedAS", ()), ("GPFL", ()), ("FedCP", ()),
                                        ("FedRep+LAG", ("-m", "CNN", "--lag_top_k", "4"))])
def test_body_shared_methods_give_the_global_body_and_a_fresh_head(data_dir, tmp_path, name, extra):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, name, *extra)
    shared = [n for n in named_tensors(newcomer.model) if not n.startswith("head.")]
    head = [n for n in named_tensors(newcomer.model) if n.startswith("head.")]
    # Everything but the head is the server's (GPFL's GCE and CoV, FedCP's global head and CPN included;
    # under X+LAG the layers LAG keeps personal too: a newcomer has no copy of its own).
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model), shared)
    if name.endswith("+LAG"):
        lag_personal = set(server.lag_personal_names())
        assert lag_personal and lag_personal <= set(shared)
        assert differs_from_every_trained_client(newcomer, server, lag_personal)
    # The head is the initial one every client started from, not any training client's trained head.
    assert state_equal(named_tensors(newcomer.model), initial, head)
    assert differs_from_every_trained_client(newcomer, server, head)


@pytest.mark.parametrize("name", ["LG-FedAvg", "FedGH"])
def test_head_shared_methods_give_the_global_head_and_a_fresh_body(data_dir, tmp_path, name):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, name)
    head = [n for n in named_tensors(newcomer.model) if n.startswith("head.")]
    base = [n for n in named_tensors(newcomer.model) if n.startswith("base.")]
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model), head)
    assert not state_equal(named_tensors(newcomer.model), initial, head)  # the server's head has trained
    assert state_equal(named_tensors(newcomer.model), initial, base)
    assert differs_from_every_trained_client(newcomer, server, base)


def test_fedbn_newcomer_keeps_fresh_normalisation_layers(data_dir, tmp_path):
    # A small model with a BatchNorm layer (the -m models that have one are slow to train here).
    from flcore.servers.serverbn import FedBN
    from utils.datasets import dataset_info
    from utils.seeding import seed_everything
    config, _ = prepare(parse_args(cli(data_dir, tmp_path, "-algo", "FedBN", "-nc", "4", "-nnc", "1", "-ften", "0",
                                       "-gr", "1")))
    seed_everything(config.seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 4))
    server = FedBN(config, hyperparameters(config), 0, model, dataset_info(config.dataset, 5, config.data_dir))
    initial = snapshot(in_use(server.clients[0]).model)
    train(server)
    newcomer = in_use(server.new_clients[0])
    norm = sorted(newcomer.local_tensor_names)
    rest = [n for n in named_tensors(newcomer.model) if n not in newcomer.local_tensor_names]
    assert norm == ["2.bias", "2.num_batches_tracked", "2.running_mean", "2.running_var", "2.weight"]
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model), rest)
    assert not state_equal(named_tensors(newcomer.model), initial, rest)
    # Affine parameters and running statistics as initialised, not any training client's.
    assert state_equal(named_tensors(newcomer.model), initial, norm)
    assert differs_from_every_trained_client(newcomer, server, norm)


def test_fedrod_newcomer_gets_the_generic_model_and_a_fresh_personal_head_it_then_trains(data_dir, tmp_path):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, "FedROD")
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    personal = snapshot(newcomer.personal_head)
    # As every training client's started: a copy of the initial generic head; not the trained generic
    # head the newcomer is built from, nor any training client's personal head.
    assert state_equal(personal, {n[len("head."):]: t for n, t in initial.items() if n.startswith("head.")})
    assert not state_equal(personal, snapshot(server.global_model.head))
    assert all(not state_equal(personal, snapshot(c.personal_head)) for c in server.clients)
    # Its fine-tuning is FedROD's local update: the personal head learns (plain fine-tuning would not touch it).
    newcomer.fine_tune(1)
    assert not state_equal(snapshot(newcomer.personal_head), personal)


def test_feddbe_newcomer_gets_the_global_mean_and_learns_its_own_bias(data_dir, tmp_path):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, "FedDBE", "-klw", "1")
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    assert torch.equal(newcomer.global_mean, server.global_feature_mean)
    assert newcomer.feature_bias.bias.abs().max() == 0
    newcomer.fine_tune(1)
    assert newcomer.feature_bias.bias.abs().max() > 0


def test_fedrep_newcomer_fine_tunes_the_head_then_the_body(data_dir, tmp_path):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, "FedRep")
    stages = []
    original = newcomer.run_epochs

    def recording(epochs, loss_fn, optimizer=None):
        trainable = {n.split(".")[0] for n, p in newcomer.model.named_parameters() if p.requires_grad}
        stages.append((epochs, trainable, optimizer))
        return original(epochs, loss_fn, optimizer)
    newcomer.run_epochs = recording
    newcomer.fine_tune(2)
    assert stages == [(2, {"head"}, newcomer.head_optimizer), (2, {"base"}, newcomer.optimizer)]
    assert all(p.requires_grad for p in newcomer.model.parameters())


# ----- personalised-copy methods: the personal model starts from the global model ----------------------
@pytest.mark.parametrize("name,personal", [("Ditto", "model_per"), ("APFL", "model_local"), ("pFedMe", "model_per"),
                                           ("FedPHP", "model_hpm"), ("Ditto+LAG", "model_per")])
def test_personalised_copies_start_from_the_global_model(data_dir, tmp_path, name, personal):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, name)
    global_state = named_tensors(server.global_model)
    assert state_equal(named_tensors(newcomer.model), global_state)
    assert state_equal(named_tensors(getattr(newcomer, personal)), global_state)
    # What is tested (APFL: the mixture) is therefore the global model too.
    assert state_equal(named_tensors(newcomer.evaluation_model()), global_state)
    # Not any training client's personal model.
    assert all(not state_equal(named_tensors(getattr(c, personal)), global_state) for c in server.clients)


def test_ditto_newcomer_personalises_and_leaves_its_global_copy(data_dir, tmp_path):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, "Ditto", "-mu", "0.1", ften=1)
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    assert not state_equal(named_tensors(newcomer.model_per), named_tensors(server.global_model))


def test_fedamp_newcomer_starts_from_the_mean_of_the_clients_models(data_dir, tmp_path):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, "FedAMP")
    models = [named_tensors(c.model) for c in server.clients]
    for name, value in named_tensors(newcomer.model).items():
        expected = sum(m[name] for m in models) / len(models)
        assert torch.allclose(value, expected, atol=1e-6), name
    # FedAMP never averages into its global model: it is still the initial one.
    assert state_equal(named_tensors(server.global_model), initial)
    assert not state_equal(named_tensors(newcomer.model), initial)


def test_fedfomo_newcomer_downloads_m_stored_models_and_combines_them_by_its_weights(data_dir, tmp_path):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, "FedFomo", "-M", "3")
    ids = list(newcomer.download_weights)
    assert len(ids) == 3 and len(set(ids)) == 3 and set(ids) <= {c.id for c in server.clients}
    raw = torch.tensor([newcomer.download_weights[i] for i in ids], dtype=torch.float64)
    positive = raw.clamp(min=0)
    state = named_tensors(newcomer.model)
    # Here some downloads lower its validation loss (with none, it would keep its fresh, initial model).
    assert positive.sum() > 0 and not newcomer.kept_own_model
    assert not state_equal(state, initial)
    weights = positive / positive.sum()
    for name, value in state.items():
        expected = sum(float(w) * server.stored_models[i][name] for w, i in zip(weights, ids))
        assert torch.allclose(value, expected, atol=1e-6), name


# ----- Local and knowledge sharing: a fresh model, trained with whatever global knowledge there is ----
def test_local_newcomer_trains_a_fresh_model_alone(data_dir, tmp_path):
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, "Local")
    assert state_equal(named_tensors(newcomer.model), initial)
    assert differs_from_every_trained_client(newcomer, server, list(initial))


def _record_calls(monkeypatch, module, name: str) -> list:
    calls, original = [], getattr(module, name)

    def recording(*args):
        calls.append(args)
        return original(*args)
    monkeypatch.setattr(module, name, recording)
    return calls


@pytest.mark.parametrize("algorithm, module, term", [("FedProto", clientproto, "prototype_loss"),
                                                       ("FD", clientfd, "distillation_loss")])
def test_knowledge_sharing_newcomer_trains_with_the_global_class_vectors(data_dir, tmp_path, monkeypatch,
                                                                        algorithm, module, term):
    """No parameters travel; the newcomer's fine-tuning loss has the method's term, fed the server's
    global prototypes (FedProto) or logits (FD)."""
    server, newcomer, initial = trained_with_newcomer(data_dir, tmp_path, algorithm)
    assert state_equal(named_tensors(newcomer.model), initial)
    fresh = server.set_clients([4])[0]
    calls = _record_calls(monkeypatch, module, term)
    in_use(fresh).fine_tune(1)
    assert calls, f"the newcomer's loss has no {term} term"
    for _, _, received in calls:
        assert torch.equal(received.vectors, server.global_vectors)
        assert torch.equal(received.present, server.global_present)
    if algorithm == "FedProto":  # classified by them; a class no training client holds takes its own
        used, own, present = fresh.global_prototypes, fresh.local_prototypes, server.global_present
        assert torch.equal(used.vectors[present], server.global_vectors[present])
        missing = own.present & ~present
        assert torch.equal(used.vectors[missing], own.vectors[missing])
        assert torch.equal(used.present, present | own.present)


def test_fill_missing_takes_own_prototypes_only_for_classes_without_a_global_one():
    received = ClassVectors(torch.tensor([[1.0, 1.0], [0.0, 0.0], [3.0, 3.0], [0.0, 0.0]]),
                            torch.tensor([True, False, True, False]))
    own = ClassVectors(torch.tensor([[9.0, 9.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]),
                       torch.tensor([True, True, False, False]))
    used = clientproto.fill_missing(received, own)
    assert torch.equal(used.vectors, torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [0.0, 0.0]]))
    assert used.present.tolist() == [True, True, True, False]


# ----- FedLAG: the layers LAG keeps personal come from the global model ------------------------------
def test_fedlag_newcomer_takes_the_average_of_the_personal_layers(data_dir, tmp_path):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, "FedLAG")
    personal = set(server.lag_personal_names())
    assert personal
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    assert differs_from_every_trained_client(newcomer, server, personal)



# ----- clustered methods: the cluster model of lowest loss on the newcomer's data ------------------------
@pytest.mark.parametrize("name,extra", [("IFCA", ("-ncs", "3")),
                                        ("CFL", ("--cfl_rule", "absolute", "--cfl_warmup", "0", "--cfl_eps1", "1e9",
                                                 "--cfl_eps2", "0"))])
def test_clustered_methods_give_a_newcomer_the_cluster_model_of_lowest_loss(data_dir, tmp_path, name, extra):
    server, newcomer, _ = trained_with_newcomer(data_dir, tmp_path, name, "-jr", "1", *extra)
    assert len(server.cluster_models) > 1
    chosen = int(np.argmin([training_loss_of(newcomer, state) for state in server.cluster_models]))
    assert newcomer.cluster == chosen
    assert state_equal(named_tensors(newcomer.model), server.cluster_models[chosen])
