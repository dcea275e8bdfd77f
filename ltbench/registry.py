"""One registry type for methods, datasets, backbones, samplers, stage-2 (posthoc) methods and the tune modes of
pretrained backbones, and the discovery that fills them.

Names are found in three places, always in this order:
1. the core's own modules (datasets, backbones, samplers and augmentation pipelines shipped in ``ltbench``);
2. Python entry points (groups ``ltbench.methods``, ``ltbench.datasets``, ``ltbench.backbones``,
   ``ltbench.posthoc``, ``ltbench.samplers``, ``ltbench.tune_modes``, ``ltbench.pipelines``,
   ``ltbench.batch_pipelines``);
   the built-in ``methods/`` package is registered this way too, so it is loaded exactly like a
   third-party plugin;
3. plugin folders, from a recipe's ``plugins:`` list and the ``LTBENCH_PLUGIN_PATH`` environment
   variable. A folder is imported as a real package (its parent goes on ``sys.path``), so its
   modules have stable names that a fresh worker process can import again.

A name registered twice by different objects is an error (not a warning): two plugins silently
shadowing each other would make results depend on import order.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import os
import pkgutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ltbench.config import from_dict, to_dict
from ltbench.errors import LtbenchError, short_repr, shorten
from ltbench.results import schema

PLUGIN_PATH_ENV = "LTBENCH_PLUGIN_PATH"
CORE_MODULES = ("ltbench.data.synthetic", "ltbench.data.fashion_mnist", "ltbench.data.cifar", "ltbench.data.splitlist", "ltbench.backbones",
                "ltbench.samplers.uniform", "ltbench.samplers.class_balanced", "ltbench.samplers.square_root",
                "ltbench.samplers.progressive")
# The augmentation pipelines import torch (and, where a pipeline builds one of its transforms, torchvision), so
# they are imported only when a pipeline is looked up (a worker building its views, a recipe naming a view
# that is no dataset alias), never by a command that only validates or lists (status, table, list).
PIPELINE_MODULES = ("ltbench.data.transforms", "ltbench.data.batch_augment")


class RegistryError(LtbenchError):
    pass


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    module: str
    source: str  # human-readable: where discovery found it
    display: str | None = None  # how tables name it ("LDAM-DRW" for ldam_drw); None: its name


_current_source: str | None = None


@contextlib.contextmanager
def _source(label: str) -> Iterator[None]:
    global _current_source
    previous, _current_source = _current_source, label
    try:
        yield
    finally:
        _current_source = previous


class Registry:
    """A name -> object table filled by the ``@REGISTRY.register(name)`` decorator."""

    def __init__(self, kind: str, group: str | None, hint_cutoff: float = 0.6, core: tuple[str, ...] = ()):
        self.kind = kind  # "method", "dataset", "backbone", "posthoc method"
        self.group = group  # entry-point group; None: the core's own table, never extended by plugins (no discovery)
        # How alike a known name must be to be suggested (difflib's ratio); a registry of a few names
        # unlike each other suggests the closest one whatever was typed (0.0).
        self.hint_cutoff = hint_cutoff
        self.core = core  # core modules that fill this registry alone, imported on its first lookup
        self._core_imported = False
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, display: str | None = None) -> Callable[[Any], Any]:
        """``@REGISTRY.register(name)``; ``display``: how tables name it (a method's row label: "LDAM-DRW",
        recorded in each result as ``method_display``), the name itself when not given."""
        if display is not None and schema.display_name_problem(display):
            raise RegistryError(f"{self.kind} '{name}': display name {schema.display_name_problem(display)}")

        def decorator(obj: Any) -> Any:
            module = getattr(obj, "__module__", "?")
            source = _current_source or f"module {module}"
            old = self._entries.get(name)
            same = old is not None and old.module == module and (
                getattr(old.obj, "__qualname__", None) == getattr(obj, "__qualname__", None)
            )
            if old is not None and not same:
                raise RegistryError(
                    f"{self.kind} name '{name}' is registered twice: by {old.module} ({old.source}) "
                    f"and by {module} ({source}); rename one of them"
                )
            if hasattr(obj, "__dict__") and not isinstance(obj, type(sys)):
                with contextlib.suppress(AttributeError, TypeError):
                    obj.registered_name = name
            self._entries[name] = Entry(name, obj, module, source, display)
            return obj

        return decorator

    def get(self, name: str) -> Any:
        self._discover()
        if not isinstance(name, str):
            raise RegistryError(f"a {self.kind} name must be a string, got {short_repr(name, 60)}")
        if name not in self._entries:
            raise RegistryError(self.unknown_message(name))
        return self._entries[name].obj

    def entry(self, name: str) -> Entry:
        self.get(name)
        return self._entries[name]

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        self._discover()
        return [self._entries[n] for n in sorted(self._entries)]

    def _discover(self) -> None:
        if self.group is not None:  # a core-only table needs no plugin import (no torch)
            discover()
        if self.core and not self._core_imported:
            self._core_imported = True
            with _source("ltbench core"):
                for module in self.core:
                    importlib.import_module(module)

    def unknown_message(self, name: str, also: Iterable[str] = ()) -> str:
        """'unknown <kind> NAME. Did you mean ...? Known: ...'; ``also``: other names the caller accepts
        (a dataset's view aliases, say), suggested and listed with the registry's."""
        known = sorted({*self._entries, *also})
        hint = did_you_mean(name, known, self.hint_cutoff)
        searched = f" Searched: {searched_locations()}" if self.group is not None else ""
        return f"unknown {self.kind} '{name}'.{hint} Known: {', '.join(known) or '(none)'}.{searched}"

    def __contains__(self, name: str) -> bool:
        self._discover()
        return name in self._entries

    # One factory from ``{name, **options}`` for every registry: the entry's ``Config`` dataclass
    # filled from the options (dotted-field errors under ``where``), then the entry called with it.

    def config(self, spec: dict, where: str) -> Any:
        """The validated, defaulted ``Config`` of ``spec`` = ``{'name': ..., **options}``. The plugin's Config
        class and its ``validate()`` are plugin code: anything but a ConfigError from them is a PluginError
        naming the plugin (``call_plugin``), never an internal error."""
        options = dict(spec)
        name = options.pop("name")
        cls = self.get(name).Config
        return call_plugin(self.label(name), "Config / validate()", from_dict, cls, options, where)

    def label(self, name: str) -> str:
        """How a message names a registered plugin: "method 'la' (module methods.la)"."""
        entry = self._entries.get(name)
        return f"{self.kind} '{name}'" + (f" (module {entry.module})" if entry is not None else "")

    def resolved(self, spec: dict, where: str) -> dict:
        """``spec`` with every default filled in, as plain data: what enters a run's configuration (and id)."""
        return {"name": spec["name"], **to_dict(self.config(spec, where))}

    def build(self, spec: dict, *args: Any, where: str, **kwargs: Any) -> Any:
        """``Entry(config, *args, **kwargs)``: the object ``spec`` names, built from its validated options."""
        return self.get(spec["name"])(self.config(spec, where), *args, **kwargs)


class PluginError(RegistryError):
    """Plugin code the core called raised, exited or returned something unusable: one line naming the plugin
    and the hook (``call_plugin``), exit 2, so a broken plugin is never an internal error or a silent exit."""


def call_plugin(label: str, hook: str, fn: Callable, *args: Any, passes: tuple = (), **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for plugin code the core calls before any run starts (``data_identity()``,
    ``check()``, a Config's ``validate()``, ``feature_spaces()``...). An LtbenchError the plugin raises for its
    user (DataMissingError, CorruptFileError, a ConfigError) passes unchanged, and so do the exceptions the
    hook's contract names (``passes``: ValueError for ``check_test_set_name``); anything else it raises,
    SystemExit and KeyboardInterrupt included (a plugin's sys.exit must not end the command silently, exit 0),
    becomes a PluginError naming ``label`` and ``hook``."""
    try:
        return fn(*args, **kwargs)
    except (LtbenchError, *passes):
        raise
    except BaseException as exc:  # noqa: BLE001 - every way plugin code can leave is named
        raise PluginError(plugin_call_message(label, hook, exc)) from None


class ProcessExitCalled(SystemExit):
    """Plugin code called ``os._exit(code)`` inside ``exits_contained``: raised instead, so the run it was
    training fails with one line and the launch goes on, where the call would have ended ltbench at once, with
    the plugin's code and no word (no ``finally``, no record, no summary)."""


@contextlib.contextmanager
def exits_contained(who: str) -> Iterator[None]:
    """While a run trains, ``os._exit`` called by this process's main thread raises ProcessExitCalled (a
    SystemExit: the runner records it as the run's failure, as it does a plugin's ``sys.exit``). A forked child
    (a DataLoader worker) inherits the replacement and must really exit, so any other process gets the real
    call; another thread of this one cannot unwind the main thread, so it says in one line which run's plugin
    ended ltbench, then exits. Only the call through ``os`` is replaced: an ``_exit`` a plugin bound by name before
    the run, a signal or a native crash still end the process. Why not a worker process per run:
    docs/architecture.md, "Plugin code"."""
    real, pid, main = os._exit, os.getpid(), threading.main_thread()

    def contained_exit(code: int) -> None:
        if os.getpid() != pid:
            real(code)
        if threading.current_thread() is not main:
            print(f"ltbench: error: {who} called os._exit({short_repr(code, 60)}) in thread "
                  f"{threading.current_thread().name!r}; ltbench ends here (a run resumes at the next launch)",
                  file=sys.__stderr__, flush=True)
            real(code)
        raise ProcessExitCalled(code)

    os._exit = contained_exit
    try:
        yield
    finally:
        os._exit = real


def plugin_call_message(label: str, hook: str, exc: BaseException) -> str:
    if isinstance(exc, ProcessExitCalled):
        what = f"called os._exit({short_repr(exc.code, 60)}), which would have ended the process with that code"
    elif isinstance(exc, SystemExit):
        what = f"called sys.exit({short_repr(exc.code, 60)})"
    else:
        what = f"raised {type(exc).__name__}" + (f": {shorten(str(exc), 160)}" if str(exc) else "")
    tail = " (if you pressed Ctrl-C, run the command again)" if isinstance(exc, KeyboardInterrupt) else ""
    return f"{label}: {hook} {what}; fix the plugin{tail}"


def checked_return(label: str, hook: str, value: Any, kind: type | tuple, limit: int | None = None,
                   expected: str = "") -> Any:
    """A plugin hook's return value, type-checked and, with ``limit``, size-checked; PluginError naming the hook
    otherwise."""
    if not isinstance(value, kind):
        raise PluginError(f"{label}: {hook} returned {short_repr(value, 80)} ({type(value).__name__}), expected "
                          f"{expected or getattr(kind, '__name__', kind)}; fix the plugin")
    if limit is not None and len(value) > limit:
        raise PluginError(f"{label}: {hook} returned {len(value)} items or characters, at most {limit} are "
                          f"allowed{f' ({expected})' if expected else ''}; fix the plugin")
    return value


def did_you_mean(name: str, known, cutoff: float = 0.6) -> str:
    """" Did you mean 'x'?" for the closest known name (difflib's ratio at least ``cutoff``), else ''."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff) if isinstance(name, str) else []
    return f" Did you mean '{close[0]}'?" if close else ""


def lookup(table, name: str, kind: str, cutoff: float = 0.6) -> Any:
    """The one lookup rule of the plain name -> object tables that need no discovery (figure kinds, table
    formats, a method's solvers): ``table[name]``, or LtbenchError naming the kind, the closest known name
    and every known one. Why not a Registry: these tables are closed (no plugin adds to them) and some
    are read on the torch-free results side, where discovery (which imports the plugins) must not run."""
    if isinstance(name, str) and name in table:
        return table[name]
    raise LtbenchError(f"unknown {kind} {short_repr(name, 60)}.{did_you_mean(name, table, cutoff)} "
                       f"Known: {', '.join(sorted(table))}")


METHODS = Registry("method", "ltbench.methods")
DATASETS = Registry("dataset", "ltbench.datasets")
BACKBONES = Registry("backbone", "ltbench.backbones")
POSTHOC = Registry("posthoc method", "ltbench.posthoc")  # stage-2 classifiers on frozen features (ltbench/posthoc.py)
SAMPLERS = Registry("sampler", "ltbench.samplers", hint_cutoff=0.0)  # training-set samplers (ltbench/samplers/)
TUNE_MODES = Registry("tune mode", "ltbench.tune_modes")  # what a pretrained backbone trains (backbone.tune)
REGISTRIES = {"methods": METHODS, "datasets": DATASETS, "backbones": BACKBONES, "posthoc": POSTHOC,
              "samplers": SAMPLERS, "tune_modes": TUNE_MODES}  # the plugin kinds a run names ('ltbench list', 'ltbench check', provenance)
# Augmentation pipelines by name (ltbench/data/transforms.py: ImageSpec -> per-image transform) and their
# batched counterparts under the same names (ltbench/data/batch_augment.py, train.augment_on=batch).
# Methods ask for them through their views; not a plugin kind of their own in 'ltbench list'/'check'.
PIPELINES = Registry("augmentation pipeline", "ltbench.pipelines", core=PIPELINE_MODULES)
BATCH_PIPELINES = Registry("batched augmentation pipeline", "ltbench.batch_pipelines", core=PIPELINE_MODULES)
DISCOVERED = (*REGISTRIES.values(), PIPELINES, BATCH_PIPELINES)  # every registry entry points can fill

# --------------------------------------------------------------------------------------------
# Discovery

_core_done = False
_entry_points_done = False
_plugin_paths: list[Path] = []
_entry_point_labels: list[str] = []


def _import_package_modules(module_name: str) -> None:
    """Import a module and, if it is a package, every public submodule in it."""
    module = importlib.import_module(module_name)
    paths = getattr(module, "__path__", None)
    if paths is None:
        return
    for info in sorted(pkgutil.iter_modules(paths), key=lambda i: i.name):
        if plugin_module_name(info.name):
            importlib.import_module(f"{module_name}.{info.name}")


def plugin_module_name(name: str) -> bool:
    """Whether discovery imports a module of a plugin folder: a public Python name. Never an editor's lock or
    backup file (``.#x.py``, ``#x.py#``, ``x.py~``, ``#x.py``), nor ``_private`` helpers (imported by their users)."""
    return name.isidentifier() and not name.startswith("_")


def _plugin_error(what: str, exc: BaseException) -> RegistryError:
    if isinstance(exc, RegistryError):
        return exc
    if isinstance(exc, (KeyboardInterrupt, GeneratorExit)) or not isinstance(exc, (Exception, SystemExit)):
        return RegistryError(f"could not load {what}: importing it raised {type(exc).__name__} "
                             f"({shorten(str(exc), 120) or 'no message'}); a plugin module must only define and "
                             f"register (if you pressed Ctrl-C, run the command again)")
    if isinstance(exc, SystemExit):  # otherwise the whole command would end, silently, with the plugin's code
        call = "os._exit" if isinstance(exc, ProcessExitCalled) else "sys.exit"
        return RegistryError(f"could not load {what}: importing it called {call}({short_repr(exc.code, 60)}); "
                             f"a plugin module must only define and register (move script code under "
                             f"'if __name__ == \"__main__\":')")
    return RegistryError(f"could not load {what}: {type(exc).__name__}: {shorten(str(exc))}")


def _load_entry_points() -> None:
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True
    for registry in DISCOVERED:
        for ep in sorted(importlib.metadata.entry_points(group=registry.group), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            dist_label = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
            label = f"entry point '{ep.name}' ({registry.group}) of {dist_label}"
            _entry_point_labels.append(label)
            try:
                with _source(label), exits_contained(label):
                    _import_package_modules(ep.value.split(":")[0])
            except ModuleNotFoundError as exc:  # its package is not here at all (not installed): listed, not an error
                if exc.name != ep.value.split(":")[0].split(".")[0]:
                    raise _plugin_error(label, exc) from exc
                _entry_point_labels[-1] += f" (not loaded: its package {exc.name} is not installed)"
            except BaseException as exc:  # a broken plugin names itself (KeyboardInterrupt raised by it too)
                raise _plugin_error(label, exc) from exc


def _env_plugin_paths() -> list[Path]:
    raw = os.environ.get(PLUGIN_PATH_ENV, "")
    return [Path(p) for p in raw.split(os.pathsep) if p.strip()]


def add_plugin_paths(paths: list[str | Path]) -> None:
    """Import plugin folders (each a package of plugin modules) that are not imported yet."""
    discover()
    for raw in paths:
        _import_plugin_folder(Path(raw))


def _import_plugin_folder(folder: Path) -> None:
    folder = folder.expanduser().resolve()
    if folder in _plugin_paths:
        return
    if folder.is_file():
        raise RegistryError(f"plugin folder {folder} is a file; give the folder that holds it ({folder.parent})")
    if not folder.is_dir():
        raise RegistryError(f"plugin folder {folder} does not exist or is not a directory")
    name = folder.name
    if not name.isidentifier():
        raise RegistryError(f"plugin folder {folder}: '{name}' is not a valid Python package name; rename it")
    existing = sys.modules.get(name)
    if existing is not None:
        existing_paths = [Path(p).resolve() for p in getattr(existing, "__path__", [])]
        if folder not in existing_paths:
            where = existing_paths[0] if existing_paths else getattr(existing, "__file__", "?")
            raise RegistryError(
                f"plugin folder {folder}: a module named '{name}' is already imported from {where}; "
                f"rename the folder"
            )
    _plugin_paths.append(folder)
    parent = str(folder.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    label = f"plugin folder {folder}"
    try:
        with _source(label), exits_contained(label):
            _import_package_modules(name)
    except BaseException as exc:
        _plugin_paths.remove(folder)  # never handed to a worker as if it had loaded
        raise _plugin_error(label, exc) from exc


class EnvPluginError(RegistryError):
    """A folder of $LTBENCH_PLUGIN_PATH could not be loaded: the recipe's ``plugins:`` is not to blame."""


def discover() -> None:
    """Fill the registries from core modules, entry points and LTBENCH_PLUGIN_PATH (idempotent)."""
    global _core_done
    if not _core_done:
        _core_done = True
        with _source("ltbench core"):
            for module in CORE_MODULES:
                importlib.import_module(module)
    _load_entry_points()
    for folder in _env_plugin_paths():
        try:
            _import_plugin_folder(folder)
        except RegistryError as exc:  # blamed on the variable, not on the recipe's plugins:
            raise EnvPluginError(f"${PLUGIN_PATH_ENV}: {exc} (fix or unset {PLUGIN_PATH_ENV})") from None


def plugin_paths() -> list[str]:
    """Plugin folders imported so far (absolute), to hand to a worker process."""
    return [str(p) for p in _plugin_paths]


def searched_locations() -> str:
    eps = "; ".join(_entry_point_labels) or "none installed"
    folders = ", ".join(str(p) for p in _plugin_paths) or "none"
    return f"ltbench's own modules; entry points: {eps}; plugin folders: {folders} (add one with the recipe key " \
           f"'plugins:' or ${PLUGIN_PATH_ENV})"
