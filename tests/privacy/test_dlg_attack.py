"""Deep Leakage from Gradients on a model small enough to check by eye: one image is rebuilt from a one-step
update and nothing from an update of zeros; PSNR and SSIM against values worked out by hand."""
import math

import pytest
import torch
from torch import nn

from flcore.exchange import ClientUpdate
from flcore.privacy.dlg import parameters_in_loss, reconstruct, soft_cross_entropy
from flcore.privacy.image_quality import PSNR_CAP, SSIM_C1, match_images, psnr, ssim, to_unit_pixels
from flcore.privacy.leakage import attack_generator, attack_model, first_batches, observed_gradient, score, sgd_steps
from utils.client_data import ClientData

LR = 0.1
SHAPE = (1, 1, 8, 8)


def tiny_net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 4))


def one_step_upload(model: nn.Module, image: torch.Tensor, label: int) -> ClientUpdate:
    """What a client uploads after one SGD step of -lr LR on (image, label): its parameters after the step."""
    trained = tiny_net()
    trained.load_state_dict(model.state_dict())
    loss = nn.functional.cross_entropy(trained(image), torch.tensor([label]))
    loss.backward()
    with torch.no_grad():
        for p in trained.parameters():
            p -= LR * p.grad
    return ClientUpdate(0, 1, {n: p.detach().clone() for n, p in trained.named_parameters()})


def attack(update: ClientUpdate):
    model = tiny_net()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    observed = observed_gradient(start, update, dict(model.named_parameters()), LR * sgd_steps(1, 10, 1))
    ready = attack_model(model, "", start, observed)
    return reconstruct(ready, observed, SHAPE, 4, attack_generator(0, 0, 0, 0))


@pytest.fixture(scope="module")
def image():
    return torch.rand(SHAPE, generator=torch.Generator().manual_seed(5)) * 2 - 1  # a stored image's range


@pytest.fixture(scope="module")
def rebuilt(image):
    return attack(one_step_upload(tiny_net(), image, 2))


def test_a_one_step_update_gives_the_image_back(image, rebuilt):
    got, real = to_unit_pixels(rebuilt.inputs), to_unit_pixels(image)
    assert float(psnr(got, real)) > 40           # about 88 dB with this seed: the image itself
    assert float((got - real).abs().max()) < 0.01  # every pixel within 1% of its range
    assert float(ssim(got, real)) > 0.99
    assert int(rebuilt.label_logits.argmax()) == 2  # the soft label found the class too
    assert float(psnr(to_unit_pixels(rebuilt.start), real)) < 12  # where it started: noise


def test_an_upload_of_zeros_reveals_nothing(image, rebuilt):
    model = tiny_net()
    unchanged = ClientUpdate(0, 1, {n: p.detach().clone() for n, p in model.named_parameters()})
    nothing = attack(unchanged)
    real = to_unit_pixels(image)
    started = float(psnr(to_unit_pixels(nothing.start), real))
    ended = float(psnr(to_unit_pixels(nothing.inputs), real))
    assert ended < 12 and abs(ended - started) < 3  # no better than the random start
    assert ended < float(psnr(to_unit_pixels(rebuilt.inputs), real)) - 25


def test_the_attack_is_reproducible_and_draws_only_from_its_generator(image, rebuilt):
    before = torch.get_rng_state()
    again = attack(one_step_upload(tiny_net(), image, 2))
    assert torch.equal(torch.get_rng_state(), before)  # the global generator is never drawn from
    assert torch.equal(again.inputs, rebuilt.inputs) and torch.equal(again.start, rebuilt.start)
    seeds = {attack_generator(0, *where).initial_seed() for where in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1))}
    assert len(seeds) == 4 and attack_generator(1, 0, 0, 0).initial_seed() not in seeds  # client, round, batch, seed


def test_psnr_by_hand():
    real = torch.zeros(2, 1, 4, 4, dtype=torch.float64)
    assert psnr(real, real).tolist() == [PSNR_CAP, PSNR_CAP] and PSNR_CAP == pytest.approx(100.0)  # the cap
    off = real + torch.tensor([0.1, 0.01], dtype=torch.float64).view(2, 1, 1, 1)
    assert psnr(off, real).tolist() == pytest.approx([20.0, 40.0])  # MSE 1e-2 and 1e-4, peak 1
    half = real.clone()
    half[0, 0, :2] = 0.5  # half the pixels off by 0.5: MSE 0.125
    assert float(psnr(half[:1], real[:1])) == pytest.approx(10 * math.log10(8))


def test_ssim_by_hand():
    a = torch.full((1, 3, 12, 12), 0.5, dtype=torch.float64)
    b = torch.full((1, 3, 12, 12), 0.25, dtype=torch.float64)
    # Flat images: no variance, so SSIM is its luminance term (2ab + C1) / (a^2 + b^2 + C1).
    assert float(ssim(a, b)) == pytest.approx((2 * 0.5 * 0.25 + SSIM_C1) / (0.25 + 0.0625 + SSIM_C1))
    noise = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert ssim(noise, noise).tolist() == pytest.approx([1.0, 1.0])  # a 7x7 window on 8x8 images
    assert float(ssim(noise[:1], 1 - noise[:1])) < 0  # inverted contrast


def test_pixels_pairs_and_scores():
    assert to_unit_pixels(torch.tensor([-1.0, 0.0, 1.0, 3.0, -2.0])).tolist() == [0.0, 0.5, 1.0, 1.0, 0.0]
    real = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    assert match_images(to_unit_pixels(real.flip(0)), to_unit_pixels(real)).tolist() == [1, 0]
    swapped = score(real.flip(0), real)  # a batch rebuilt in the other order is rebuilt all the same
    assert swapped.psnr.tolist() == [PSNR_CAP, PSNR_CAP] and swapped.ssim.tolist() == pytest.approx([1.0, 1.0])


def test_the_targets_and_the_steps_the_attacker_assumes():
    data = ClientData(torch.arange(25.0).view(25, 1, 1, 1), torch.zeros(25, dtype=torch.long))
    batches = first_batches(data, 10, 5)  # two full batches of 10, as training's loader makes (the rest dropped)
    assert [b.flatten().tolist() for b in batches] == [list(range(10)), list(range(10, 20))]
    assert [b.flatten().tolist() for b in first_batches(data, 10, 1)] == [list(range(10))]
    assert [len(b) for b in first_batches(data, 40, 2)] == [25]  # fewer samples than -lbs: one batch of all
    assert (sgd_steps(25, 10, 1), sgd_steps(25, 10, 3), sgd_steps(7, 10, 2), sgd_steps(25, 10, 0)) == (2, 6, 2, 0)


class WithOwnModule(nn.Module):
    """A classifier beside a module of its method's own, which only the method's own loss trains (GPFL's)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)
        self.extra = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_a_tensor_the_loss_never_reaches_is_left_out():
    model = WithOwnModule()
    names = [n for n, _ in model.named_parameters()]
    assert parameters_in_loss(model, names, SHAPE, 4) == ("fc.weight", "fc.bias")
    logits = torch.tensor([[2.0, 0.0]])
    assert float(soft_cross_entropy(logits, torch.tensor([[1.0, 0.0]]))) == pytest.approx(
        float(nn.functional.cross_entropy(logits, torch.tensor([0]))))
