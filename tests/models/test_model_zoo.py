"""PFLlib's other ``-m`` models: each trains, splits into base and head, and groups into FedLAG layers.

Sizes are tiny (16x16 images, a 50-token vocabulary, 12-token texts) so the file stays fast on one core.
"""
import pytest
import torch
from torch import nn

from helpers import assert_lag_composes, server_for
from flcore.lag.conflict import build_layers
from flcore.trainmodel.models import (CONVOLUTIONAL, IMAGE_MODELS, MODELS, TEXT_MODELS, UnknownModelError,
                                      build_model, example_batch, split_head)
from app.options import parse_args

VOCAB, LENGTH, CLASSES, BATCH = 50, 12, 5, 3

# One sample's shape per new model: small images, HAR's and Amazon Review's real shapes, short texts.
SHAPES = {**{name: (3, 16, 16) for name in ("LeNet", "AlexNet", "GoogleNet", "MobileNet", "ResNet10", "ResNet34")},
          "HARCNN": (9, 1, 128), "AmazonMLP": (5000,), **{name: (LENGTH,) for name in TEXT_MODELS}}


def make(name: str, shape=None, **text_options) -> nn.Module:
    torch.manual_seed(0)
    if name in TEXT_MODELS:
        text_options = {"vocab_size": VOCAB, **text_options}
    return build_model(name, shape or SHAPES[name], CLASSES, **text_options)


def padded_texts(length: int = LENGTH) -> torch.Tensor:
    """A full text, a half-padded one, and one of padding only."""
    torch.manual_seed(1)
    tokens = torch.randint(1, VOCAB, (BATCH, length))
    tokens[1, length // 2:] = 0
    tokens[2] = 0
    return tokens


def inputs(name: str) -> torch.Tensor:
    if name in TEXT_MODELS:
        return padded_texts()
    torch.manual_seed(1)
    return torch.randn(BATCH, *SHAPES[name])


def test_every_model_is_registered_with_a_shape_here_or_in_test_models():
    assert set(SHAPES) | set(IMAGE_MODELS) == set(MODELS)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_forward_and_backward_give_logits_and_finite_gradients_for_every_parameter(name):
    model = make(name)
    out = model(inputs(name))
    assert out.shape == (BATCH, CLASSES) and model.fc.out_features == CLASSES
    nn.functional.cross_entropy(out, torch.arange(BATCH) % CLASSES).backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{name}: {param_name} gets no gradient"
        assert torch.isfinite(param.grad).all(), f"{name}: {param_name}"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_split_head_covers_every_parameter_exactly_once_and_keeps_the_function(name):
    model = make(name).eval()
    x = inputs(name)
    with torch.no_grad():
        expected = model(x)
    body = {id(p) for n, p in model.named_parameters() if not n.startswith("fc.")}
    count = sum(1 for _ in model.parameters())
    split = split_head(model).eval()
    base = [id(p) for p in split.base.parameters()]
    head = [id(p) for p in split.head.parameters()]
    every = [id(p) for p in split.parameters()]
    assert len(every) == len(set(every)) == count           # nothing lost, nothing tied
    assert sorted(base + head) == sorted(every) and not set(base) & set(head)
    assert set(base) == body                                 # the base is the model itself, minus fc
    assert isinstance(split.base.fc, nn.Identity) and isinstance(split.head, nn.Linear)
    with torch.no_grad():
        assert torch.allclose(split(x), expected, atol=1e-6)


@pytest.mark.parametrize("name", sorted(TEXT_MODELS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_text_models_take_padding_only_texts_and_score_each_text_alone(name, mode):
    model = make(name).train(mode == "train")
    tokens = padded_texts()
    out = model(tokens)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    if mode == "eval":  # packing sorts texts by length: each result must go back to its own text
        with torch.no_grad():
            alone = torch.cat([model(tokens[i:i + 1]) for i in range(BATCH)])
            assert torch.allclose(alone, model(tokens), atol=1e-5)


@pytest.mark.parametrize("name", sorted(set(TEXT_MODELS) - {"TextCNN"}))
def test_trailing_padding_does_not_change_a_text_models_output(name):
    # TextCNN is left out: as in Kim's model, its max-pool also sees windows over the padding.
    model = make(name, (2 * LENGTH,), max_len=2 * LENGTH).eval()
    tokens = padded_texts()
    longer = torch.cat([tokens, torch.zeros_like(tokens)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(tokens), model(longer), atol=1e-5)


@pytest.mark.parametrize("name", ["LSTM", "Transformer"])
def test_module_granularity_puts_every_parameter_in_one_layer_named_by_its_module(name):
    model = split_head(make(name))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    layers = build_layers(names, "module")
    grouped = [t for layer in layers for t in layer.tensors]
    assert sorted(grouped) == sorted(names) and len(grouped) == len(set(grouped))
    for layer in layers:
        own = dict(model.get_submodule(layer.name).named_parameters(recurse=False))
        assert set(layer.tensors) == {f"{layer.name}.{n}" for n in own}, layer


def test_a_two_layer_lstm_is_one_fedlag_layer_at_module_granularity():
    # nn.LSTM holds both of its layers' weights itself (weight_ih_l0 ... bias_hh_l1): one module, one layer.
    model = split_head(make("LSTM"))
    layers = {layer.name: layer.tensors for layer in build_layers([n for n, _ in model.named_parameters()], "module")}
    assert list(layers) == ["base.embedding", "base.lstm", "head"]
    assert layers["base.lstm"] == tuple(f"base.lstm.{kind}_l{i}" for i in (0, 1)
                                        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    tensor_layers = build_layers([n for n, _ in model.named_parameters()], "tensor")
    assert len(tensor_layers) == 1 + 8 + 2  # tensor granularity scores each LSTM weight on its own


def test_transformer_layers_follow_the_encoder_modules():
    model = split_head(make("Transformer"))
    names = [layer.name for layer in build_layers([n for n, _ in model.named_parameters()], "module")]
    per_block = ["self_attn", "self_attn.out_proj", "linear1", "linear2", "norm1", "norm2"]
    blocks = [f"base.encoder.layers.{i}.{part}" for i in (0, 1) for part in per_block]
    assert names == ["base.embedding", "base.positions", *blocks, "head"]


@pytest.mark.parametrize("name,shape,match", [
    ("LSTM", (LENGTH,), "-vs/--vocab_size"),
    ("Transformer", (3, 16, 16), r"needs token ids \(max_len,\)"),
    ("AmazonMLP", (1, 28, 28), r"needs feature vectors \(D,\)"),
    ("HARCNN", (5000,), r"needs sensor windows \(C, 1, T\)"),
    ("GoogleNet", (LENGTH,), r"needs image inputs \(C, H, W\)"),
])
def test_a_model_given_the_wrong_kind_of_input_is_refused_by_name(name, shape, match):
    with pytest.raises(UnknownModelError, match=match):
        build_model(name, shape, CLASSES)


@pytest.mark.parametrize("name,shape", [("LeNet", (1, 11, 28)), ("AlexNet", (3, 7, 7)), ("HARCNN", (9, 1, 27)),
                                        ("TextCNN", (4,))])
def test_inputs_below_a_models_minimum_are_refused_with_the_minimum(name, shape):
    with pytest.raises(UnknownModelError, match=f"model {name} needs inputs of at least .*choose another -m"):
        make(name, shape)


@pytest.mark.parametrize("name,shape", [("LeNet", (1, 12, 12)), ("AlexNet", (3, 8, 8)), ("HARCNN", (9, 1, 28)),
                                        ("TextCNN", (5,))])
def test_inputs_at_a_models_minimum_run(name, shape):
    model = make(name, shape).eval()
    assert model(example_batch(name, shape)).shape == (2, CLASSES)


def test_max_len_must_cover_the_datasets_texts_and_sizes_the_position_table():
    with pytest.raises(UnknownModelError, match="raise -ml to at least 12"):
        make("Transformer", max_len=LENGTH - 1)
    assert make("Transformer", max_len=200).positions.num_embeddings == 200
    assert make("Transformer").positions.num_embeddings == LENGTH   # -ml left out: the dataset's length


def test_example_batch_is_token_ids_for_text_models_and_floats_otherwise():
    assert example_batch("LSTM", (LENGTH,)).dtype == torch.int64
    assert example_batch("LeNet", (1, 28, 28)).shape == (2, 1, 28, 28)
    assert make("fastText")(example_batch("fastText", (LENGTH,))).shape == (2, CLASSES)


def test_channels_last_is_kept_for_two_dimensional_image_convolutions_only():
    assert CONVOLUTIONAL <= set(IMAGE_MODELS) and {"LeNet", "GoogleNet", "MobileNet", "ResNet34"} <= CONVOLUTIONAL
    model = make("MobileNet")
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)
    assert "HARCNN" not in CONVOLUTIONAL


def test_vocab_size_and_max_len_flags_use_pfllib_names_and_defaults(capsys):
    args = parse_args(["-vs", "32000", "-ml", "64"])
    assert (args.vocab_size, args.max_len) == (32000, 64)
    defaults = parse_args([])
    # -vs is left open and resolved from a text dataset's config.json (tests/data/test_text_data.py).
    assert (defaults.vocab_size, defaults.max_len) == (None, 200)
    with pytest.raises(SystemExit):
        parse_args(["-vs", "1", "-ml", "0"])
    err = capsys.readouterr().err
    assert "-vs/--vocab_size must be >= 2" in err and "-ml/--max_len must be >= 1" in err


def test_fedrep_lag_runs_on_a_new_image_model_with_module_layers(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-data", "Toy3", "-nc", "4", "-m", "LeNet", "-algo", "FedRep+LAG",
                        "--lag_granularity", "module", "--lag_top_k", "3")  # FedRep's head + 2 layers
    personal = assert_lag_composes(server, k=2)
    assert all(name.startswith("base.") for name in personal)
