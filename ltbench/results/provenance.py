"""Where a result came from: versions, code revision, host and CPU, scheduler ids, plugin source hashes.

The CPU model matters: the same recipe is bit-identical run after run on one machine type, but
floating-point kernels differ between CPU types, so results agree across machines only within the
seed spread.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import ltbench
from ltbench import registry
from ltbench.results.identity import code_entry


def git_state(folder: Path) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": commit, "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def collect() -> dict:
    import torch
    import torchvision

    info = {
        "ltbench_version": ltbench.__version__,
        **git_state(Path(ltbench.__file__).resolve().parent.parent),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv,
    }
    for key, env in (("slurm_job_id", "SLURM_JOB_ID"), ("slurm_array_job_id", "SLURM_ARRAY_JOB_ID"),
                     ("slurm_array_task_id", "SLURM_ARRAY_TASK_ID"), ("requeue_count", "SLURM_RESTART_COUNT")):
        value = os.environ.get(env)
        info[key] = int(value) if value and value.isdigit() else value
    if info["requeue_count"] is None and info["slurm_job_id"] is not None:
        info["requeue_count"] = 0
    return info


def cpu_model() -> str | None:
    """The CPU model name ('model name' in /proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _names_in(options, key: str = "name") -> list[str]:
    """Every ``name`` value in a nested configuration (a method may name auxiliary methods)."""
    out = []
    if isinstance(options, dict):
        if isinstance(options.get(key), str):
            out.append(options[key])
        for value in options.values():
            out += _names_in(value, key)
    elif isinstance(options, list):
        for value in options:
            out += _names_in(value, key)
    return out


def _imported_names(module) -> set[str]:
    """Modules a module's source imports (``import a.b``, ``from .c import d``: 'a.b', 'pkg.c', 'pkg.c.d'),
    read from its syntax tree, so ``from helpers import CONSTANT`` counts too."""
    try:
        with open(module.__file__, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, TypeError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), module.__package__)
            except (ImportError, ValueError):
                continue
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def module_closure(module_name: str) -> set[str]:
    """The module and, transitively, the modules of its own package that it uses (its imports, and the
    modules of the classes and functions in its globals). Core ``ltbench`` modules stop the walk: they
    are covered by the git commit."""
    top = module_name.split(".")[0]
    seen, todo = set(), [module_name]
    while todo:
        name = todo.pop()
        module = sys.modules.get(name)
        if name in seen or module is None:
            continue
        seen.add(name)
        if top == "ltbench":
            continue
        used = _imported_names(module)
        for value in vars(module).values():
            used.add(value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None))
        todo += [u for u in used if isinstance(u, str) and u.split(".")[0] == top and u not in seen]
    return seen


def plugin_code(config: dict) -> dict[str, dict]:
    """{module: {path, sha256}} for the source of every plugin module the run uses: the modules of
    its method (and any method it names, e.g. an auxiliary one), dataset, backbone and sampler, built-in ones
    included, plus the package-local modules they use. Status compares these with the files on disk
    to flag results computed by code that has changed since."""
    wanted = [(registry.METHODS, n) for n in _names_in(config.get("method"))]
    wanted += [(registry.DATASETS, config["data"]["name"]), (registry.BACKBONES, config["backbone"]["name"])]
    if config.get("sampler"):  # absent for the default sampler (then the record is as before samplers existed)
        wanted.append((registry.SAMPLERS, config["sampler"]["name"]))
    modules: set[str] = set()
    for reg, name in wanted:
        if name in reg:
            modules |= module_closure(reg.entry(name).module)

    out = {}
    for name in sorted(modules):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and os.path.isfile(path):
            out[name] = code_entry(name, os.path.abspath(path))  # path relative to its package's folder
    return out
