"""Experiment trackers a run can also write to: ``train.loggers: [tensorboard, wandb]`` (off by default).

Researchers in long-tailed recognition watch training live in TensorBoard (the LDAM-DRW and ProCo code
bases log to it) or Weights & Biases. ``log.jsonl`` stays the run's record; a logger receives the same
per-epoch row (loss, lr, img/s, train accuracy, and the test metrics when ``train.eval_every`` logs
them) as scalars, with the epoch as the step. Loggers are an execution setting: they are left out of
the run id (``identity.EXECUTION_SETTINGS``), so turning one on never changes which run a result belongs to.

Both packages are optional (``pip install 'ltbench[loggers]'``). What can be known before training is
checked at launch and refused with one line (``check_loggers``: a package not installed, W&B without
credentials and not offline, a TensorBoard folder that is a file); a logger that still fails to start or to
log is dropped with a warning and the run goes on: loggers are an execution setting, never a run's failure. Registered by decorator:
``@register_logger("name")`` on a class with ``__init__(run_dir, spec)``, ``log(scalars, step)`` and
``close()``; ``create_loggers`` is the one factory.
"""

from __future__ import annotations

import configparser
import importlib.util
import netrc
import os
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ltbench.config import LOGGER_PACKAGES as PACKAGES
from ltbench.errors import ConfigError, shorten

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
    """The run's loggers as one: ``log(row)`` sends a log.jsonl row to each, ``close()`` ends them. A logger
    that fails (its server gone, its disk full) is dropped with one warning: log.jsonl is the run's record,
    a tracker only a view of it, so it never costs the run."""

    def __init__(self, loggers: list, say: Callable[[str], None] = print):
        self.loggers, self.say = list(loggers), say

    def log(self, row: dict) -> None:
        values = scalars(row)
        for logger in list(self.loggers):
            self._call(logger, "log", lambda: logger.log(values, int(row["epoch"])))

    def close(self) -> None:
        for logger in list(self.loggers):
            self._call(logger, "close", logger.close)

    def _call(self, logger, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a tracker's failure is never the run's
            self.loggers.remove(logger)
            self.say(f"warning: train.loggers: {_name(logger)} failed in {what}() ({type(exc).__name__}: "
                     f"{shorten(str(exc), 200)}); the run goes on without it (log.jsonl has every row)")


def _name(logger) -> str:
    return next((name for name, cls in LOGGERS.items() if isinstance(logger, cls)), type(logger).__name__)


def create_loggers(names, run_dir: Path, spec, say: Callable[[str], None] = print) -> LoggerSet:
    """Start the named loggers. What can be checked before training was (``check_loggers``, at launch); a
    logger that still cannot start here is dropped with a warning, and the run goes on without it (loggers
    are not part of the run id, so a failure here must not record the run as failed)."""
    out = []
    for name in names:
        try:
            out.append(LOGGERS[name](Path(run_dir), spec))
        except Exception as exc:  # noqa: BLE001 - ImportError, a refused login, an unusable folder...
            say(f"warning: train.loggers: '{name}' could not start ({type(exc).__name__}: {shorten(str(exc), 200)}); "
                f"the run goes on without it (log.jsonl has every row)")
    return LoggerSet(out, say)


# ------------------------------------------------------------------------------------------------
# Before training: what can be known without starting a logger


def check_loggers(runs) -> None:
    """Refuse, before any run starts, a logger that cannot start: its package missing, W&B without
    credentials and not offline, a TensorBoard folder that is a file. One ConfigError naming the fix. Why
    before: loggers are an execution setting, so a run that failed on one would be refused later without
    it; what cannot be known here (a server that refuses) is dropped with a warning at the run's start."""
    names = {name for spec in runs for name in spec.config["train"].get("loggers", [])}
    for name in sorted(names):
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"train.loggers: '{name}' needs the {PACKAGES[name]} package; install it with pip "
                              f"install {PACKAGES[name]} (or pip install 'ltbench[loggers]'), or remove '{name}'")
    if "wandb" in names and not wandb_can_start():
        raise ConfigError("train.loggers: 'wandb' has no W&B credentials here and is not offline: run 'wandb login' "
                          "(or set WANDB_API_KEY), or set WANDB_MODE=offline to log locally ('wandb sync' uploads later)")
    for spec in runs:
        folder = Path(spec.run_dir) / "tensorboard"
        if "tensorboard" in spec.config["train"].get("loggers", []) and os.path.lexists(folder) and not folder.is_dir():
            raise ConfigError(f"train.loggers: 'tensorboard' writes into {folder}, which is not a folder; move it "
                              f"away, or remove 'tensorboard'")


def wandb_can_start() -> bool:
    """Whether wandb.init can start without asking: offline or disabled, or credentials where wandb reads them
    (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, a netrc entry for the W&B host, the settings file's api_key)."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled"):
        return True
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    settings = configparser.ConfigParser()
    folder = os.environ.get("WANDB_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "wandb")
    try:
        settings.read(os.path.join(folder, "settings"))
    except (configparser.Error, OSError, UnicodeDecodeError):
        pass
    if settings.get("default", "mode", fallback="").lower() in ("offline", "dryrun", "disabled") \
            or settings.get("default", "api_key", fallback=""):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    for path in filter(None, [os.environ.get("NETRC"), os.path.expanduser("~/.netrc"), os.path.expanduser("~/_netrc")]):
        try:
            if netrc.netrc(path).authenticators(host):
                return True
        except (netrc.NetrcParseError, OSError, UnicodeDecodeError):
            continue
    return False
