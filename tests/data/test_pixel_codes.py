"""Images kept as one-byte codes: every batch is bit for bit the float batch it replaces, in a quarter of
the memory."""
import numpy as np
import torch

from dataset.utils.generate import PartitionOptions, build_dataset
from dataset.utils.raw_data import images_to_float
from flcore.vmapped.stacking import StackedData
from utils.client_data import ClientData, load_client_data
from utils.datasets import dataset_info
from utils.input_kinds import inputs_tensor
from utils.pixel_codes import generator_palette, image_codes

CPU = torch.device("cpu")


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def test_every_pixel_value_of_each_generator_decodes_to_the_float_it_stored():
    for max_value in (255, 16):
        pixels = np.arange(max_value + 1, dtype=np.uint8).reshape(1, 1, max_value + 1)  # N x H x W
        stored = images_to_float(pixels, float(max_value))
        codes, palette = image_codes(stored)
        assert codes.dtype == np.uint8 and codes.reshape(-1).tolist() == list(range(max_value + 1))
        assert np.array_equal(bits(palette[codes]), bits(stored))
        assert palette is generator_palette(max_value)


def test_other_floats_get_their_own_palette_and_zero_keeps_its_sign():
    x = np.array([0.0, -0.0, 0.3, 1.7, 0.3, -0.0], dtype=np.float32).reshape(6, 1, 1, 1)
    codes, palette = image_codes(x)
    assert len(palette) == 4 and codes[0, 0, 0, 0] != codes[1, 0, 0, 0]  # 0.0 and -0.0 are two codes
    assert np.array_equal(bits(palette[codes]), bits(x))


def test_more_than_256_distinct_values_stay_floats():
    x = np.linspace(-1, 1, 257, dtype=np.float32).reshape(257, 1, 1, 1)
    assert image_codes(x) is None
    assert image_codes(x[:256]) is not None


def coded_dataset(tmp_path, shape=(3, 8, 8)):
    pixels = np.random.default_rng(0).integers(0, 256, size=(120, shape[1], shape[2], shape[0]), dtype=np.uint8)
    x = images_to_float(pixels)
    y = np.arange(120, dtype=np.int64) % 3
    build_dataset(tmp_path / "Pixels", x, y, PartitionOptions(num_clients=2, partition="dir", alpha=1.0,
                                                              min_samples=20))
    return dataset_info("Pixels", 2, tmp_path)


def test_a_coded_client_batches_exactly_as_its_float_images_would(tmp_path):
    info = coded_dataset(tmp_path)
    for channels_last in (False, True):
        coded = load_client_data(info, 0, "train", CPU, num_classes=3, channels_last=channels_last)
        assert coded.x.dtype == torch.uint8 and coded.palette is not None
        floats = ClientData(coded.palette[coded.x.long()].contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format), coded.y)
        assert floats.x.is_contiguous(memory_format=torch.channels_last) == channels_last
        pairs = list(zip(coded.train_batches(7, torch.Generator().manual_seed(3)),
                         floats.train_batches(7, torch.Generator().manual_seed(3))))
        pairs += list(zip(coded.eval_batches(16), floats.eval_batches(16)))
        for (x_coded, y_coded), (x_float, y_float) in pairs:
            assert x_coded.dtype == torch.float32 and x_coded.stride() == x_float.stride()
            assert torch.equal(x_coded.view(torch.int32), x_float.view(torch.int32)) and torch.equal(y_coded, y_float)
        rest, held = coded.split_off(0.25, seed=(1,))
        assert rest.palette is coded.palette and held.x.dtype == torch.uint8 and len(rest) + len(held) == len(coded)


def test_coded_images_take_a_quarter_of_the_float_bytes(tmp_path):
    info = coded_dataset(tmp_path)
    coded = load_client_data(info, 1, "test", CPU, num_classes=3)
    n, values = len(coded), 3 * 8 * 8
    assert coded.stored_bytes() == n * values + n * 8 + 256 * 4
    floats = inputs_tensor(coded.palette[coded.x.long()].numpy(), "image")
    assert floats.numel() * floats.element_size() == 4 * n * values


class Holder:
    def __init__(self, id, data):
        self.id, self.train_data = id, data


def test_the_batched_engine_stacks_codes_and_decodes_the_rows_it_reads(tmp_path):
    info = coded_dataset(tmp_path)
    clients = [Holder(i, load_client_data(info, i, "train", CPU, num_classes=3)) for i in range(2)]
    stacked = StackedData("train_data")
    offsets = stacked.offsets(clients)
    assert stacked.x.dtype == torch.uint8
    index = torch.tensor([[offsets[1], offsets[1] + 2], [offsets[0] + 1, offsets[0]]])
    expected = torch.stack([torch.stack([clients[1].train_data.inputs(clients[1].train_data.x[[0, 2]])[k]
                                         for k in range(2)]),
                            clients[0].train_data.inputs(clients[0].train_data.x[[1, 0]])])
    assert torch.equal(stacked.inputs(index), expected)
    # Clients whose palettes differ are decoded once, when stacked.
    clients[1].train_data = ClientData(clients[1].train_data.x, clients[1].train_data.y,
                                       clients[1].train_data.palette.flip(0))
    stacked.offsets(clients)
    assert stacked.palette is None and stacked.x.dtype == torch.float32
    assert torch.equal(stacked.inputs(torch.tensor([offsets[1]])), clients[1].train_data.inputs(clients[1].train_data.x[:1]))
