"""Training samplers (ltbench/samplers/): each sampler's class law per epoch, the default's order bit for
bit as before, determinism per (seed, epoch), DDP shards, worker counts, mid-epoch resume, the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from ltbench.train.engine import Loader, SeededSamples, cut_batches, epoch_batches
from ltbench.registry import SAMPLERS
from ltbench.samplers import SamplerContext, class_quotas, create_sampler, power_law, resolve_sampler
from ltbench.seeding import derive_seed
from tests.conftest import ROOT

COUNTS = np.array([500, 300, 158, 91, 50, 28, 16, 9, 5, 5])  # a long tail with two 5-image classes
LABELS = np.repeat(np.arange(len(COUNTS)), COUNTS)
EPOCHS = 30


def make(name: str, labels: np.ndarray = LABELS, epochs: int = EPOCHS):
    return create_sampler({"name": name}, SamplerContext(labels, int(labels.max()) + 1, epochs))


def the_law(name: str, epoch: int, counts: np.ndarray = COUNTS) -> np.ndarray:
    """Each sampler's class distribution, written out here from Kang et al. 2020 (not from the code)."""
    n, k = counts.sum(), len(counts)
    if name == "uniform":
        return counts / n
    if name == "class_balanced":
        return np.full(k, 1 / k)
    if name == "square_root":
        return np.sqrt(counts) / np.sqrt(counts).sum()
    t = epoch / EPOCHS
    return (1 - t) * counts / n + t / k


def old_epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """engine.epoch_batches as it was before samplers existed, copied verbatim (the order every recorded
    run trained on)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "order", epoch))
    order = torch.randperm(n, generator=gen).numpy()
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches.pop()
    return batches


def test_the_four_samplers_are_registered():
    assert {"uniform", "class_balanced", "square_root", "progressive"} <= set(SAMPLERS.names())


@pytest.mark.parametrize("n,batch,seed,epoch", [(1162, 64, 0, 0), (1162, 64, 2, 29), (33, 16, 5, 3), (50000, 128, 1, 7)])
def test_uniform_is_bit_identical_to_the_order_before_samplers(n, batch, seed, epoch):
    labels = np.arange(n) % 7
    expected = old_epoch_batches(n, batch, seed, epoch)
    for got in (epoch_batches(n, batch, seed, epoch), cut_batches(make("uniform", labels).epoch_order(seed, epoch), batch)):
        assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize("name", ["uniform", "class_balanced", "square_root", "progressive"])
def test_class_frequencies_per_epoch_match_the_sampler_law(name):
    sampler, n = make(name), len(LABELS)
    for epoch in (0, 1, 14, 29):
        order = sampler.epoch_order(seed=3, epoch=epoch)
        assert order.shape == (n,) and order.min() >= 0 and order.max() < n
        frequencies = np.bincount(LABELS[order], minlength=len(COUNTS))
        law = the_law(name, epoch)
        assert np.allclose(sampler.class_probabilities(epoch), law)
        assert np.abs(frequencies - n * law).max() < 1.0, (epoch, frequencies, n * law)  # the law up to rounding
        assert frequencies.sum() == n
        for c in range(len(COUNTS)):  # within a class: its images as evenly as the quota allows
            uses = np.bincount(order[LABELS[order] == c], minlength=n)[LABELS == c]
            assert uses.max() - uses.min() <= 1, (name, epoch, c)


def test_progressive_moves_from_instance_to_class_balanced():
    sampler = make("progressive")
    tail = [np.bincount(LABELS[sampler.epoch_order(0, e)], minlength=10)[-1] for e in range(EPOCHS)]
    assert tail[0] == 5 and tail == sorted(tail) and tail[-1] > 100  # 5 images drawn ~113 times by the end
    assert np.array_equal(np.sort(sampler.epoch_order(0, 0)), np.arange(len(LABELS)))  # epoch 0: each image once


def test_order_depends_on_seed_and_epoch_only():
    a, b = make("class_balanced"), make("class_balanced")
    assert np.array_equal(a.epoch_order(1, 4), b.epoch_order(1, 4))  # a fresh sampler: no hidden state
    assert not np.array_equal(a.epoch_order(1, 4), a.epoch_order(1, 5))
    assert not np.array_equal(a.epoch_order(1, 4), a.epoch_order(2, 4))


def test_quotas_sum_to_n_and_follow_the_largest_remainders():
    assert class_quotas(np.array([1, 1, 1]), 10).tolist() == [4, 3, 3]
    assert class_quotas(np.array([0.5, 0.25, 0.25]), 7).tolist() == [3, 2, 2]  # 3.5, 1.75, 1.75
    assert power_law(np.array([4, 0, 1]), 0.0).tolist() == [0.5, 0.0, 0.5]  # an empty class is never drawn


def test_a_repeated_image_gets_a_fresh_augmentation_and_keys_do_not_depend_on_the_start_step():
    order = make("class_balanced").epoch_order(0, 0)
    batches = cut_batches(order, 64)
    samples = SeededSamples({}, seed=0)
    keys = [k for b in samples.train_keys(batches, 0, epoch=0) for k in b]
    assert len(set(keys)) == len(keys)  # (image, augmentation seed) never repeats within an epoch
    assert len({i for _, i, _ in keys}) < len(keys)  # although images do
    resumed = samples.train_keys(batches, 5, epoch=0)
    assert resumed == samples.train_keys(batches, 0, epoch=0)[5:]


def test_the_same_batches_whatever_the_worker_count():
    from ltbench.data import transforms
    from ltbench.data.base import MultiView
    from ltbench.data.synthetic import SyntheticLT, SyntheticLTConfig

    data = SyntheticLT(SyntheticLTConfig(num_classes=4, max_per_class=16, imb_factor=8)).load()
    sampler = make("class_balanced", data.train_labels)
    views = [transforms.build("default", data.image, data.pipelines)]
    samples = SeededSamples({"train": MultiView(data.train, views)}, seed=1)
    keys = samples.train_keys(cut_batches(sampler.epoch_order(1, 2), 8), 0, epoch=2)
    inline = list(Loader(samples, 0).run(keys))
    pooled = Loader(samples, 2)
    got = list(pooled.run(keys))
    pooled.close()
    assert len(got) == len(inline)
    for (v0, y0), (v1, y1) in zip(inline, got):
        assert torch.equal(y0, y1) and torch.equal(v0[0], v1[0])
    assert (np.bincount(np.concatenate([y.numpy() for _, y in got]), minlength=4) == len(data.train) // 4).sum() >= 2


DDP_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch.distributed as dist
    from ltbench.train import distributed, engine
    config = json.loads(sys.argv[1])
    rank, world = distributed.init_from_env()
    run = engine.build_run(config)
    samples = engine.SeededSamples({}, config["seed"])
    mine = {}
    for epoch, start in ((0, 0), (3, 2)):
        batches = engine.sampled_batches(run, config["seed"], epoch)
        mine[f"{epoch}:{start}"] = samples.train_keys(batches, start, epoch, rank, world)
    shards = [None] * world
    dist.all_gather_object(shards, mine)
    if rank == 0:
        whole = {}
        for epoch, start in ((0, 0), (3, 2)):
            batches = engine.sampled_batches(run, config["seed"], epoch)
            whole[f"{epoch}:{start}"] = samples.train_keys(batches, start, epoch)
        print("RESULT" + json.dumps({"shards": shards, "whole": whole}))
    distributed.shutdown()
""")


@pytest.mark.slow  # two processes that import torch and build a run: ~10 s
@pytest.mark.parametrize("sampler", ["class_balanced", "uniform"])
def test_ddp_shards_are_disjoint_and_cover_the_epoch(tmp_path, write_recipe, sampler):
    from ltbench.recipe import load_recipe
    from tests.test_distributed import launch

    recipe = write_recipe(extra={"sampler": {"name": sampler}, "data": {"max_per_class": 40, "imb_factor": 10},
                                 "optim": {"batch_size": 8, "epochs": 4}})
    config = load_recipe(recipe).runs[0].config
    script = tmp_path / "shards.py"
    script.write_text(DDP_SCRIPT)
    outs = launch(2, [str(script), json.dumps(config)], timeout=120)
    for out in outs:
        assert out.returncode == 0, out.stderr
    found = json.loads(outs[0].stdout.split("RESULT", 1)[1])
    for part, whole in found["whole"].items():
        shard0, shard1 = (found["shards"][r][part] for r in (0, 1))
        assert len(shard0) == len(shard1) == len(whole)  # every rank takes every step
        for b0, b1, b in zip(shard0, shard1, whole):
            assert not {tuple(k) for k in b0} & {tuple(k) for k in b1}  # disjoint
            assert sorted(map(tuple, b0 + b1)) == sorted(map(tuple, b))  # together: the global batch
            assert abs(len(b0) - len(b1)) <= 1


def test_resolution_writes_the_default_out():
    assert resolve_sampler(None, None, "ce") == {"name": "uniform"}
    assert resolve_sampler({"name": "uniform"}, None, "ce") == {"name": "uniform"}
    assert resolve_sampler({}, {"name": "class_balanced"}, "crt_stage1") == {"name": "class_balanced"}
    from ltbench.errors import ConfigError

    with pytest.raises(ConfigError, match="needs sampler"):
        resolve_sampler({"name": "uniform"}, {"name": "class_balanced"}, "crt_stage1")


SAMPLER_PLUGIN = '''
import numpy as np
import torch.nn.functional as F
from ltbench.registry import METHODS, SAMPLERS
from ltbench.samplers import ClassLawSampler
from methods.ce import CrossEntropy


@SAMPLERS.register("tail_only")
class TailOnly(ClassLawSampler):
    """Only the rarest class (a plugin sampler, for the tests)."""

    def class_probabilities(self, epoch):
        counts = self.ctx.class_counts
        return (counts == counts[counts > 0].min()).astype(float)


@METHODS.register("ce_balanced_stage1")
class CEBalanced(CrossEntropy):
    """CE that needs class-balanced batches (a method declaring its sampler)."""

    sampler = {"name": "class_balanced"}
'''


@pytest.mark.slow  # three commands and a training run: ~15 s
def test_plugin_sampler_and_method_declared_sampler(tmp_path, write_recipe, cli):
    (tmp_path / "sampler_plugins").mkdir()
    (tmp_path / "sampler_plugins" / "tail.py").write_text(SAMPLER_PLUGIN)
    listed = cli("list", "samplers", "--plugins", tmp_path / "sampler_plugins")
    assert listed.returncode == 0 and "tail_only" in listed.stdout and "uniform" in listed.stdout
    from ltbench.recipe import load_recipe

    recipe = write_recipe(extra={"plugins": ["./sampler_plugins"], "method": {"name": "ce_balanced_stage1"}})
    run = load_recipe(recipe).runs[0]
    assert run.config["sampler"] == {"name": "class_balanced"}
    refused = cli("run", recipe, "--dry-run", "sampler.name=tail_only")
    assert refused.returncode == 2 and "needs sampler" in refused.stderr and "Traceback" not in refused.stderr
    # The sampler takes effect: a model trained on the rarest class alone predicts nothing else.
    trained = cli("run", recipe, "method.name=ce", "sampler.name=tail_only")
    assert trained.returncode == 0, trained.stderr
    result = json.loads(next((tmp_path / "results").rglob("result.json")).read_text())
    assert result["config"]["sampler"] == {"name": "tail_only"}
    assert result["metrics"]["per_class"] == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.slow  # four commands in fresh processes: ~8 s
def test_cli_lists_samplers_and_refuses_an_unknown_one_with_a_suggestion(write_recipe, cli):
    listed = cli("list", "samplers")
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines() if line and not line[0].isspace()]
    assert names == ["class_balanced", "progressive", "square_root", "uniform"]  # each with a 'from ...' line
    out = cli("run", write_recipe(extra={"sampler": {"name": "no_such"}}), "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "sampler.name: unknown sampler 'no_such'. Did you mean" in out.stderr
    typo = cli("run", write_recipe(extra={"sampler": {"name": "class_balance"}}), "--dry-run")
    assert typo.returncode == 2 and "Did you mean 'class_balanced'?" in typo.stderr
    bad_option = cli("run", write_recipe(extra={"sampler": {"name": "uniform", "q": 2}}), "--dry-run")
    assert bad_option.returncode == 2 and "sampler.q: unknown key" in bad_option.stderr


def test_sampler_is_in_the_run_id_and_the_label_and_the_default_is_explicit(write_recipe):
    from ltbench.recipe import load_recipe, run_label

    plain = load_recipe(write_recipe()).runs[0]
    uniform = load_recipe(write_recipe(extra={"sampler": {"name": "uniform"}})).runs[0]
    balanced = load_recipe(write_recipe(extra={"sampler": {"name": "class_balanced"}})).runs[0]
    assert plain.config["sampler"] == {"name": "uniform"} and plain.run_id == uniform.run_id != balanced.run_id
    assert run_label(balanced) == "ce (sampler=class_balanced)" and run_label(plain) == "ce"


@pytest.mark.slow  # three runs of a tiny recipe: ~15 s
def test_a_run_with_a_resampler_killed_mid_epoch_resumes_exactly(tmp_path, write_recipe, cli):
    from tests.test_engine import crash_mid_epoch_then_resume

    got, expected = crash_mid_epoch_then_resume(tmp_path, write_recipe, cli, sampler={"name": "progressive"})
    assert got["config"]["sampler"] == {"name": "progressive"}
    assert got["metrics"]["per_class"] == expected["metrics"]["per_class"]


CHECKED_SAMPLERS = '''
import numpy as np
from ltbench.registry import SAMPLERS
from ltbench.samplers import ClassLawSampler, Sampler


@SAMPLERS.register("half_balanced")
class HalfBalanced(ClassLawSampler):
    """Half-way between instance- and class-balanced."""

    def class_probabilities(self, epoch):
        counts = self.ctx.class_counts
        return 0.5 * counts / counts.sum() + 0.5 / len(counts)


@SAMPLERS.register("remembers")
class Remembers(Sampler):
    """Broken: each call continues the previous one's random stream (resume would replay other batches)."""

    rng = np.random.default_rng(0)

    def epoch_order(self, seed, epoch):
        return self.rng.permutation(len(self.ctx.labels))
'''


def test_check_runs_the_sampler_contract(tmp_path, capsys):
    from ltbench import cli

    (tmp_path / "checked_samplers").mkdir()
    (tmp_path / "checked_samplers" / "two.py").write_text(CHECKED_SAMPLERS)
    code = cli.main(["check", str(tmp_path / "checked_samplers")])
    out = capsys.readouterr().out
    assert code == 1
    assert "ok    sampler half_balanced" in out
    assert "FAIL  sampler remembers" in out and "pure function of seed and epoch" in out


def test_a_sampler_order_of_floats_is_refused_not_truncated():
    """S13: epoch_order() giving floats (2.7) was cast to int64, silently training on other samples."""
    from types import SimpleNamespace

    import numpy as np

    from ltbench.errors import MethodContractError
    from ltbench.train.engine import sampled_batches

    class Floats:
        registered_name = "floats"

        def epoch_order(self, seed, epoch):
            return np.arange(6) + 0.7

    run = SimpleNamespace(data=SimpleNamespace(train=[0] * 6), sampler=Floats(), optim=SimpleNamespace(batch_size=2))
    with pytest.raises(MethodContractError, match="whole-number indices, got dtype float64"):
        sampled_batches(run, 0, 0)
    Floats.epoch_order = lambda self, seed, epoch: np.arange(6)[::-1].copy()
    assert [b.tolist() for b in sampled_batches(run, 0, 0)] == [[5, 4], [3, 2], [1, 0]]
