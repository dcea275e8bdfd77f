"""What bounds a run's training epoch: the loader's rate alone against the epoch that was trained.

For each run of a recipe (the same command line as ``ltbench run``, overrides included), this builds the run
as the engine does and times one pass of epoch 1's training batches through the run's own loader (same
workers, same pipelines; with ``train.augment_on: batch`` also the views built by ``augment_on_device``),
without any forward or backward pass: the rate at which data can be delivered. It prints that beside the
epoch time the run itself logged (``log.jsonl``, when the run has been trained under ``--results``). When the
data rate is far above the epoch's rate, the epoch is bound by the model's compute; when they are close, by
loading and augmentation.

    python benchmarks/epoch_bounds.py recipes/imagenet_lt.yaml --results OUT [overrides...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def data_pass(config: dict, seed: int) -> tuple[float, int]:
    """Seconds to load (and, with augment_on: batch, augment) every training batch of epoch 1, and images."""
    import torch

    from ltbench.train import engine, feed
    from ltbench.config import TrainConfig, from_dict

    device = engine.pick_device()
    engine.set_threads(from_dict(TrainConfig, config["train"], "train"), device)
    torch.manual_seed(0)
    run = engine.build_run(config)
    loader = engine.make_loader(run, seed, run.train.num_workers, device)
    keys = loader.samples.train_keys(engine.epoch_batches(len(run.data.train), run.optim.batch_size, seed, 0), 0, 0)
    started, images = time.perf_counter(), 0
    for (views, labels), batch_keys in zip(loader.run(keys), keys):
        if run.device_views is not None:
            views = engine.augment_on_device(run, views[0] if run.decode_on_device else feed.to_device(views[0], device),
                                             batch_keys, device)
        images += len(labels)
    seconds = time.perf_counter() - started  # includes starting the workers, as a run's first epoch does
    loader.close()
    return seconds, images


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--results", default=None)
    args = ap.parse_intermixed_args(argv)
    from ltbench.results import store
    from ltbench.recipe import load_recipe, run_label

    recipe = load_recipe(args.recipe, args.overrides, args.results)
    for spec in recipe.runs:
        seconds, images = data_pass(spec.config, spec.config["seed"])
        log = store.read_jsonl(Path(spec.run_dir) / store.LOG)
        trained = f"epoch 1 trained: {log[0]['seconds']:.1f} s ({log[0]['images_per_s']:.2f} img/s)" if log \
            else "not trained under --results"
        print(f"{spec.run_id} {run_label(spec)[:40]} augment_on={spec.config['train'].get('augment_on', 'worker')}: "
              f"data alone {seconds:.1f} s for {images} images ({images / seconds:.2f} img/s); {trained}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
