"""``search: {sampler: tpe}``: one Optuna study per grid point and seed, kept in a journal in the results folder.

A study per (grid point, seed) because the recipe's seeds are replicates of the whole tuning procedure
(DomainBed draws each trial seed's hyper-parameters apart): each seed's cell is the test accuracy of the best
of its own ``trials`` trials on validation, the random search's budget. The journal (``JOURNAL``) is Optuna's
file journal, JSON lines read back with ``json.loads`` only (no pickle): it is data, and one that cannot be
read is one line naming it. Optuna is imported only when a recipe asks for tpe. A trial's drawn values are
its user attribute ``values``, so its run's configuration is rebuilt from the journal exactly; the worker
loop is ltbench/run/tpe.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ltbench import search
from ltbench.recipe.trials import Study
from ltbench.errors import ConfigError, WriteError, shorten
from ltbench.results import store

JOURNAL = "search-tpe.journal"  # in the recipe's results folder: every study of the recipe
INSTALL = "pip install 'ltbench[tune]'"


def require_optuna(where: str):
    """The optuna module, or a one-line ConfigError naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(f"{where} needs Optuna, which is not installed here; {INSTALL} (or use the default "
                          f"random search: remove sampler)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its INFO lines would bury the runs' own
    return optuna


def check(where: str) -> None:
    """A recipe that asks for tpe: Optuna must be importable (search.SearchSampler.hooks)."""
    require_optuna(where)


def suggest(trial: Any, space: dict) -> dict:
    """Ask an Optuna trial for a value of each option of the space: the same distributions as random search,
    continuous values rounded to ``search.DIGITS`` significant digits as random search rounds its draws."""
    values = {}
    for key, dist in sorted(space.items()):
        if dist.kind == "choice":
            values[key] = trial.suggest_categorical(key, list(dist.args))
        elif dist.kind == "int_uniform":
            values[key] = trial.suggest_int(key, dist.args[0], dist.args[1])
        else:
            raw = trial.suggest_float(key, dist.args[0], dist.args[1], log=dist.kind == "log_uniform")
            values[key] = min(max(search._round(raw), dist.args[0]), dist.args[1])
    return values


def journal_path(root: Path) -> Path:
    return Path(root) / JOURNAL


def damaged(path: Path, why: str) -> ConfigError:
    path = journal_path(path) if Path(path).is_dir() else path
    return ConfigError(f"{path}: not a usable Optuna journal ({shorten(why, 200)}); move it aside to start the "
                       f"search's studies anew (the finished runs stay in their folders and are not trained again)")


MAX_JOURNAL_BYTES = 256 * store.MiB  # one line per trial event: a few kB per trial


class FlockJournalLock:
    """Optuna's journal lock as an flock on ``<journal>.flock`` (the lock a run folder has: store.claim_run).
    Optuna's own file locks (a symlink, or a file made with O_EXCL) outlive a process killed while appending:
    the next writer waits 30 s, then breaks the lock, even a live slow writer's, which may interleave two
    appends. The kernel drops an flock when its holder dies in any way."""

    def __init__(self, path: Path):
        self.path, self._lock = Path(str(path) + ".flock"), None

    def acquire(self) -> bool:
        self._lock = store.lock_file(self.path)
        return True

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # drops the flock
            self._lock = None


def cut_torn_tail(path: Path, out=print) -> None:
    """Before any append: a last line without its newline (a writer killed mid-append; Optuna's reader skips
    it) is cut, under the journal's lock, so the next operation is never appended after it (the two would
    read as one damaged line, and the journal would be refused for good). Through the store's door: bounded,
    no-follow."""
    if not path.is_file() or path.is_symlink():
        return
    import os

    lock = FlockJournalLock(path)
    lock.acquire()
    try:
        with store.open_bounded(path, MAX_JOURNAL_BYTES) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(size - (1 << 20), 0))
            tail = f.read()
        if not tail or tail.endswith(b"\n"):
            return
        if b"\n" not in tail and size > len(tail):
            raise damaged(path, "its last line is torn and longer than 1 MiB")
        keep = size - len(tail) + tail.rfind(b"\n") + 1
        with store.open_append(path) as f:
            os.ftruncate(f.fileno(), keep)
        out(f"{path}: cut a torn last line ({size - keep} bytes, a writer stopped mid-append) before appending")
    except (store.UnusableFile, WriteError) as exc:
        raise damaged(path, exc.reason if isinstance(exc, store.UnusableFile) else exc.strerror) from None
    finally:
        lock.release()


def open_journal(path: Path, optuna):
    """Optuna's storage over the journal file (created when missing), every line read and replayed now, so a
    damaged journal is said here, in one line, before any run."""
    try:  # created here (no-follow, inside the root), so Optuna, which opens it itself, finds a regular file
        store.open_append(path).close()
        store.open_bounded(path, MAX_JOURNAL_BYTES).close()
    except (store.UnusableFile, WriteError) as exc:
        raise damaged(path, exc.reason if isinstance(exc, store.UnusableFile) else exc.strerror) from None
    from optuna.storages.journal import JournalFileBackend

    try:  # the backend only calls the lock's acquire() and release()
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=FlockJournalLock(path)))
        storage.get_all_studies()
    except Exception as exc:  # noqa: BLE001 - any fault of the file's content (JSON, missing keys, types)
        raise damaged(path, f"{type(exc).__name__}: {exc}") from None
    return storage


def recorded_trials(root: Path, studies: list[Study], trials: int) -> dict[str, list[tuple[int, str, dict | None]]]:
    """Study name -> [(trial number, state, drawn values or None)] of the trials the journal holds with numbers
    below ``trials`` (values None: asked, and its worker died before drawing: drawn when it is taken over);
    empty when there is no journal yet (nothing is created)."""
    path = journal_path(root)
    if not studies or not (path.exists() or path.is_symlink()):
        return {}
    optuna = require_optuna("sampler: tpe")
    storage = open_journal(path, optuna)
    wanted = {s.name: s for s in studies}
    out: dict[str, list[tuple[int, str, dict | None]]] = {}
    try:
        for frozen in storage.get_all_studies():
            study = wanted.get(frozen.study_name)
            if study is None:
                continue
            for t in storage.get_all_trials(frozen._study_id, deepcopy=False):
                if t.number >= trials:
                    continue  # past this recipe's budget (it was raised, then lowered)
                values = t.user_attrs.get("values")
                out.setdefault(study.name, []).append(
                    (t.number, t.state.name, None if values is None else checked_values(values, study, t.number, path)))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a journal whose lines are JSON but not Optuna's operations
        raise damaged(path, f"{type(exc).__name__}: {exc}") from None
    return out


def state_counts(recorded: dict) -> dict[str, int]:
    """'COMPLETE', 'PRUNED', 'FAIL', 'RUNNING' -> how many trials of the recorded studies are in it."""
    counts: dict[str, int] = {}
    for trials in recorded.values():
        for _, state, _ in trials:
            counts[state] = counts.get(state, 0) + 1
    return counts


def checked_values(values: Any, study: Study, number: int, path: Path) -> dict:
    """A trial's recorded values, read from the journal (data): the keys of the study's space, plain values."""
    if not isinstance(values, dict) or set(values) != set(study.space):
        raise damaged(path, f"trial {number} of study {study.name} records values for {short(values)}, "
                            f"not for its space {sorted(study.space)}")
    for key, value in values.items():
        if not study.space[key].holds(value):
            raise damaged(path, f"trial {number} of study {study.name}: {key} is {short(value)}, not a draw of its "
                                f"space {study.space[key].text()}")
    return values


def short(value: Any) -> str:
    return shorten(repr(value), 80)
