"""Every named augmentation pipeline on small and large images; Cutout's border clipping."""

from __future__ import annotations

import pytest
import torch

from ltbench.data import transforms
from ltbench.data.base import ImageSpec
from ltbench.data.transforms import PIPELINES, Cutout
from ltbench.errors import ConfigError

CASES = {
    "gray28": (ImageSpec(size=28, channels=1, mean=(0.286,), std=(0.353,), kind="small"), (1, 28, 28)),
    "rgb32": (ImageSpec(size=32, channels=3, mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
                        kind="small"), (3, 32, 32)),
    "large": (ImageSpec(size=224, channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), kind="large"),
              (3, 300, 260)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", PIPELINES.names())
def test_every_pipeline_runs(name, case):
    spec, shape = CASES[case]
    torch.manual_seed(0)
    image = torch.randint(0, 256, shape, dtype=torch.uint8)
    tf = transforms.build(name, spec)
    for _ in range(2):
        out = tf(image)
        assert out.dtype == torch.float32
        assert tuple(out.shape) == (spec.channels, spec.size, spec.size)
        assert torch.isfinite(out).all()


def test_eval_is_deterministic_and_normalises():
    spec, shape = CASES["rgb32"]
    image = torch.full(shape, 255, dtype=torch.uint8)
    out = transforms.build("eval", spec)(image)
    expected = torch.tensor([(1 - m) / s for m, s in zip(spec.mean, spec.std)]).view(3, 1, 1).expand(3, 32, 32)
    assert torch.allclose(out, expected, atol=1e-5)


def test_aliases_and_unknown_names():
    spec = CASES["rgb32"][0]
    aliases = {"default": "standard", "strong": "autoaug_cutout", "sim": "simaug", "eval": "eval"}
    assert transforms.resolve("strong", aliases) == "autoaug_cutout"
    assert transforms.build("sim", spec, aliases)(torch.zeros(3, 32, 32, dtype=torch.uint8)).shape == (3, 32, 32)
    with pytest.raises(ConfigError, match="unknown augmentation pipeline 'nope'"):
        transforms.build("nope", spec, aliases)
    with pytest.raises(ConfigError, match="Did you mean 'simaug'.*Known: .*autoaug_cutout, default, eval"):
        transforms.build("simaugg", spec, aliases)


def test_a_pipeline_name_taken_twice_is_refused():
    """PIPELINES is a registry (ltbench/registry.py): a second 'standard' from another module would silently
    replace the first (a dict did), so it is an error naming both."""
    from ltbench.registry import BATCH_PIPELINES, RegistryError

    def standard(spec):
        return None

    standard.__module__ = "someone_elses_plugin"
    for registry in (PIPELINES, BATCH_PIPELINES):
        with pytest.raises(RegistryError, match="'standard' is registered twice: by ltbench.data.*someone_elses"):
            registry.register("standard")(standard)
    assert PIPELINES.get("standard").__module__ == "ltbench.data.transforms"


def _seed_with_centre_near_corner(h: int, w: int, near: int) -> tuple[int, int, int]:
    """A seed whose first Cutout centre (y, x) lies within ``near`` pixels of the top-left corner."""
    for seed in range(100000):
        torch.manual_seed(seed)
        y, x = int(torch.randint(h, ())), int(torch.randint(w, ()))
        if y < near and x < near:
            return seed, y, x
    raise AssertionError("no seed found")


def test_cutout_square_is_clipped_at_the_border():
    h = w = 32
    length = 16
    seed, y, x = _seed_with_centre_near_corner(h, w, near=4)
    torch.manual_seed(seed)
    out = Cutout(n_holes=1, length=length)(torch.ones(3, h, w))
    zero = (out == 0).all(0)
    assert ((out == 0) | (out == 1)).all() and (zero == (out[0] == 0)).all()  # same mask on every channel
    rows, cols = torch.nonzero(zero, as_tuple=True)
    # the square [y-8, y+8) x [x-8, x+8) clipped to the image: starts at the corner, smaller than 16 x 16
    assert rows.min() == 0 and cols.min() == 0
    assert rows.max() == y + length // 2 - 1 and cols.max() == x + length // 2 - 1
    assert int(zero.sum()) == (y + length // 2) * (x + length // 2) < length * length
    # a centre away from the borders zeroes the full square
    for seed in range(1000):
        torch.manual_seed(seed)
        cy, cx = int(torch.randint(h, ())), int(torch.randint(w, ()))
        if 8 <= cy <= 24 and 8 <= cx <= 24:
            break
    torch.manual_seed(seed)
    assert int((Cutout(1, length)(torch.ones(1, h, w)) == 0).sum()) == length * length


@pytest.mark.parametrize("name", ["standard", "eval"])
@pytest.mark.parametrize("case,shape", [("gray28", (1, 28, 28)), ("rgb32", (3, 32, 32)), ("rgb32", (3, 27, 40))])
def test_small_image_fast_path_is_bit_identical_to_torchvision(name, case, shape):
    """Same output tensor and same RNG consumption as the v2 pipeline it replaces, seed by seed."""
    spec = CASES[case][0]
    fast = transforms.build(name, spec)
    assert isinstance(fast, transforms.SmallTensorFastPath)
    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (60, *shape), dtype=torch.uint8, generator=gen)
    for seed, image in enumerate(images):
        torch.manual_seed(seed)
        expected, next_draw = fast.reference(image), torch.rand(())
        torch.manual_seed(seed)
        got = fast(image)
        assert torch.equal(got, expected.as_subclass(torch.Tensor)), seed
        assert torch.equal(torch.rand(()), next_draw)
    pil = transforms.build(name, spec)  # other inputs take the v2 pipeline itself
    from torchvision.transforms.v2.functional import to_pil_image

    assert pil(to_pil_image(images[0])).shape[0] == shape[0]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", PIPELINES.names())
def test_every_pipeline_equals_its_torchvision_compose_bit_for_bit(name, case):
    """The direct paths (DirectPipeline, SmallTensorFastPath) give the v2.Compose's output and leave the
    RNG where the Compose leaves it, so a seeded sample is the same whichever path builds it."""
    spec, shape = CASES[case]
    tf = transforms.build(name, spec)
    reference = getattr(tf, "reference", None)
    assert reference is not None, f"{name} has no direct path"
    gen = torch.Generator().manual_seed(2)
    for seed in range(24 if case != "large" else 6):
        image = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        torch.manual_seed(seed)
        expected, next_draw = reference(image), torch.rand(())
        torch.manual_seed(seed)
        got = tf(image)
        assert type(got) is torch.Tensor
        assert torch.equal(got, expected.as_subclass(torch.Tensor)), (name, case, seed)
        assert torch.equal(torch.rand(()), next_draw), (name, case, seed)


def test_small_image_views_leave_torchvision_unimported():
    """A Fashion-MNIST or CIFAR worker imports the engine, builds its crop + flip and eval views and runs them on
    uint8 tensors without importing torchvision (1.7 s of its start); a PIL image, which needs the v2 pipeline,
    imports it then. Run in a fresh process: this one imported torchvision long ago."""
    import subprocess
    import sys

    code = ("import sys, torch; from ltbench.train import engine; from ltbench.data import transforms; "
            "from ltbench.data.base import ImageSpec; from ltbench.results import provenance; "
            "spec = ImageSpec(size=28, channels=1, mean=(0.286,), std=(0.353,), kind='small'); "
            "views = [transforms.build(n, spec) for n in ('standard', 'eval')]; "
            "image = torch.zeros(1, 28, 28, dtype=torch.uint8); [v(image) for v in views]; "
            "version = provenance.torchvision_version(); "
            "assert 'torchvision' not in sys.modules, 'torchvision imported'; "
            "from PIL import Image; views[0](Image.new('L', (28, 28))); "
            "import torchvision; assert version == torchvision.__version__, version")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
