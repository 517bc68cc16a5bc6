import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from fssl import augment

RNG = np.random.default_rng(0)


def imgs(n=8, c=3, h=16, w=16):
    return torch.from_numpy(RNG.integers(0, 256, (n, c, h, w), dtype=np.uint8))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_weak_is_a_per_sample_crop_of_the_reflect_padded_image():
    x = imgs(16, 1, 12, 12)
    out = augment.weak(x, flip=False, gen=gen())
    pad = round(0.125 * 12)
    padded = torch.nn.functional.pad(x.float(), (pad,) * 4, mode="reflect")
    offsets = set()
    for i in range(len(x)):
        hits = [
            (dy, dx)
            for dy in range(2 * pad + 1)
            for dx in range(2 * pad + 1)
            if torch.equal(padded[i, :, dy : dy + 12, dx : dx + 12], out[i].float())
        ]
        assert hits, f"sample {i} is not a crop"
        offsets.add(hits[0])
    assert len(offsets) > 3  # offsets drawn per sample


def test_flip_only_when_asked():
    x = torch.zeros(64, 1, 8, 8, dtype=torch.uint8)
    x[:, :, :, 1] = 255  # bright column at x = 1 (pad is 1)
    left = lambda out: (out[:, 0, 4, :4] == 255).any(1)  # noqa: E731
    assert 10 < int(left(augment.flip_crop(x, True, gen())).sum()) < 54  # some flipped
    assert left(augment.weak(x, flip=False, gen=gen())).all()


def test_strong_is_per_sample_and_in_range():
    one = imgs(1)
    x = one.repeat(64, 1, 1, 1)
    out = augment.strong(x, flip=True, gen=gen())
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert len({o.numpy().tobytes() for o in out}) > 55
    assert torch.equal(out, augment.strong(x, flip=True, gen=gen()))  # seeded
    assert not torch.equal(out, augment.strong(x, flip=True, gen=gen(1)))


@pytest.mark.parametrize("channels", [1, 3])
def test_equalize_matches_pil(channels):
    x = torch.from_numpy(RNG.integers(40, 120, (4, channels, 16, 16), dtype=np.uint8))
    got = augment.equalize(x)
    for i in range(4):
        arr = x[i].permute(1, 2, 0).numpy().squeeze()
        ref = np.asarray(ImageOps.equalize(Image.fromarray(arr)))
        assert np.array_equal(got[i].permute(1, 2, 0).numpy().squeeze(), ref)


def test_posterize_and_solarize_match_pil():
    x = imgs(2, 3)
    m0 = torch.zeros(2)  # posterize: 4 bits
    post = augment.apply_op("posterize", x.float(), m0).to(torch.uint8)
    sol = augment.apply_op("solarize", x.float(), torch.full((2,), 0.5)).to(torch.uint8)
    for i in range(2):
        pil = Image.fromarray(x[i].permute(1, 2, 0).numpy())
        assert np.array_equal(
            post[i].permute(1, 2, 0).numpy(), np.asarray(ImageOps.posterize(pil, 4))
        )
        assert np.array_equal(
            sol[i].permute(1, 2, 0).numpy(), np.asarray(ImageOps.solarize(pil, 128))
        )


def test_autocontrast_stretches_to_full_range():
    x = torch.from_numpy(RNG.integers(50, 100, (3, 1, 8, 8), dtype=np.uint8)).float()
    out = augment.apply_op("autocontrast", x, torch.zeros(3))
    assert torch.allclose(out.amin((1, 2, 3)), torch.zeros(3))
    assert torch.allclose(out.amax((1, 2, 3)), torch.full((3,), 255.0))


def test_colour_ops_blend_with_their_reference():
    x = imgs(2).float()
    dark = augment.apply_op("brightness", x, torch.zeros(2))  # factor 0.05
    assert torch.allclose(dark, x * 0.05)
    gray = augment.apply_op("color", x, torch.zeros(2))
    spread = (gray - gray.mean(1, keepdim=True)).abs().max()
    assert spread < (x - x.mean(1, keepdim=True)).abs().max() * 0.1
    flat = augment.apply_op("contrast", x, torch.zeros(2))
    assert flat.std() < x.std() * 0.1


def test_translate_moves_content_and_fills_gray():
    x = torch.zeros(1, 1, 20, 20)
    x[:, :, :, 12] = 255.0
    out = augment.apply_op("translate_x", x, torch.ones(1))  # +30% of the width
    assert (out[0, 0, :, 6] == 255).all() and (out[0, 0, :, 12] == 0).all()
    assert (out[0, 0, :, 15:] == augment.GRAY).all()


def test_rotate_keeps_the_centre_and_shear_moves_rows():
    x = imgs(1, 1, 21, 21).float()
    rot = augment.apply_op("rotate", x, torch.ones(1))  # +30 degrees
    assert rot[0, 0, 10, 10] == x[0, 0, 10, 10] and not torch.equal(rot, x)
    shear = augment.apply_op("shear_x", x, torch.full((1,), 0.5))  # magnitude 0: identity
    assert torch.equal(shear, x)


def test_cutout_is_a_gray_square():
    x = torch.zeros(32, 1, 16, 16, dtype=torch.uint8)
    out = augment.cutout_(x, gen(), 0.5)
    for o in out:
        ys, xs = (o[0] == 127).nonzero(as_tuple=True)
        if len(ys):
            h, w = int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)
            assert h * w == len(ys) and max(h, w) <= 9  # one filled box
            inside = ys.min() > 0 and xs.min() > 0 and ys.max() < 15 and xs.max() < 15
            assert abs(h - w) <= 1 or not inside  # square unless clipped
    assert (out == 127).any(dim=(1, 2, 3)).sum() > 20


def test_batched_ops_equal_each_op_applied_alone():
    """The fused, sync-free RandAugment step gives every sample exactly its own op and magnitude."""
    n = 4 * len(augment.OPS)
    x = imgs(n, 3, 16, 16).float()
    op = torch.arange(n) % len(augment.OPS)
    m = torch.from_numpy(RNG.random(n)).float()
    out = augment.apply_ops(x, op, m)
    for i in range(n):
        name = augment.OPS[int(op[i])]
        ref = (
            x[i : i + 1]
            if name == "identity"
            else augment.apply_op(name, x[i : i + 1], m[i : i + 1])
        )
        assert torch.allclose(out[i : i + 1], ref, atol=1e-3), name


def test_fused_and_subset_rand_augment_give_identical_images():
    x = imgs(256, 3, 16, 16)
    a = augment.rand_augment(x, gen(), fused=True)
    b = augment.rand_augment(x, gen(), fused=False)
    assert torch.equal(a, b)
