"""Experiment trackers a run can also write to: ``train.loggers: [tensorboard, wandb]`` (off by default).

Researchers in long-tailed recognition watch training live in TensorBoard (the LDAM-DRW and ProCo code
bases log to it) or Weights & Biases. ``log.jsonl`` stays the run's record; a logger receives the same
per-epoch row (loss, lr, img/s, train accuracy, and the test metrics when ``train.eval_every`` logs
them) as scalars, with the epoch as the step. Loggers are an execution setting: they are left out of
the run id (``config.NOT_IN_RUN_ID``), so turning one on never changes which run a result belongs to.

Both packages are optional (``pip install 'ltbench[loggers]'``); asking for one that is not installed
fails the run at its start with one line saying what to install. Registered timm-style:
``@register_logger("name")`` on a class with ``__init__(run_dir, spec)``, ``log(scalars, step)`` and
``close()``; ``create_loggers`` is the one factory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ltbench.config import LOGGER_PACKAGES as PACKAGES
from ltbench.errors import ConfigError

LOGGERS: dict[str, Callable] = {}


def register_logger(name: str):
    def add(cls):
        LOGGERS[name] = cls
        return cls
    return add


def scalars(row: dict) -> dict[str, float]:
    """The numeric values of a log.jsonl row, nested ones (``test``) as ``test/all``; the epoch is the step."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}/{k}": float(v) for k, v in value.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
            out[key] = float(value)
    return out


@register_logger("tensorboard")
class TensorBoardLogger:
    """Event files in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir results/<recipe>``)."""

    def __init__(self, run_dir: Path, spec):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register_logger("wandb")
class WandbLogger:
    """A W&B run named by the run id (resumed runs continue it), project = the recipe name, files in
    ``RUN_DIR/wandb/``. ``WANDB_MODE=offline`` keeps everything local (``wandb sync`` uploads later)."""

    def __init__(self, run_dir: Path, spec):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=spec.recipe, name=spec.run_id, id=spec.run_id, resume="allow",
                              dir=str(run_dir), config=spec.config, reinit=True)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class LoggerSet:
    """The run's loggers as one: ``log(row)`` sends a log.jsonl row to each, ``close()`` ends them."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def log(self, row: dict) -> None:
        values = scalars(row)
        for logger in self.loggers:
            logger.log(values, int(row["epoch"]))

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def create_loggers(names, run_dir: Path, spec) -> LoggerSet:
    """Start the named loggers; a missing package is one line naming what to install."""
    out = []
    for name in names:
        try:
            out.append(LOGGERS[name](Path(run_dir), spec))
        except ImportError as exc:
            raise ConfigError(f"train.loggers: '{name}' needs the {PACKAGES[name]} package ({exc}); install it "
                              f"with pip install {PACKAGES[name]} (or pip install 'ltbench[loggers]')") from None
    return LoggerSet(out)
