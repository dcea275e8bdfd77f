"""Where a result came from: versions, code revision, host and CPU, scheduler ids, the code it executed,
and the numerics it was computed under.

The numerics matter: a tiny CPU run repeated on one machine under the same numerics gave the same metrics
(tests/test_identity.py), but floating-point kernels differ between CPU types and kernel environments
(``MKL_CBWR``, ``ONEDNN_MAX_CPU_ISA``: docs/results-schema.md), and the thread count changes how reductions
are split (``fmnist_bape`` seed 0: All 70.06 with 2 threads, 68.86 with 1, same CPU type). So a result
records them (``numerics``), and two results of one run id stand for each other only when they match
(``identity.numerics_difference``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

import ltbench
from ltbench import registry
from ltbench.results import caches, code, identity, store


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


# Folders of a checkout or a results tree from which a path reads the same on every machine.
PATH_ANCHORS = ("ltbench", "methods", "recipes", "results", "docs", "tests", "scripts", "benchmarks")


def portable_path(text: str) -> str:
    """A record never stores a path of the machine that made it: '/home/me/ltbench/runner.py' ->
    'ltbench/runner.py' (from the first folder of ``PATH_ANCHORS``), any other absolute path -> '.../name'.
    Other text is returned as it is."""
    if not isinstance(text, str) or not text.startswith("/"):
        return text
    parts = Path(text).parts
    for i, part in enumerate(parts):
        if part in PATH_ANCHORS:
            return "/".join(parts[i:])
    return ".../" + parts[-1] if len(parts) > 1 else text


def portable(obj):
    """``obj`` with every string that is an absolute path made portable (``portable_path``), recursively."""
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v) for v in obj]
    return portable_path(obj)


def collect() -> dict:
    import torch

    info = {
        "ltbench_version": ltbench.__version__,
        **git_state(Path(ltbench.__file__).resolve().parent.parent),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision_version(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "argv": sys.argv,
    }
    for key, env in (("slurm_job_id", "SLURM_JOB_ID"), ("slurm_array_job_id", "SLURM_ARRAY_JOB_ID"),
                     ("slurm_array_task_id", "SLURM_ARRAY_TASK_ID"), ("requeue_count", "SLURM_RESTART_COUNT")):
        value = os.environ.get(env)
        info[key] = int(value) if value and value.isdigit() else value
    if info["requeue_count"] is None and info["slurm_job_id"] is not None:
        info["requeue_count"] = 0
    return info


def torchvision_version() -> str:
    """``torchvision.__version__`` without importing torchvision (1.7 s, torch._dynamo through torchvision.ops,
    in a run whose views may never call it): the literal its version.py assigns, read as text. When torchvision
    is imported already, or its version.py holds no such literal, the module's own attribute."""
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")  # finds the package, runs none of it
        for folder in (spec.submodule_search_locations or []) if spec else []:
            try:
                text = (Path(folder) / "version.py").read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            found = re.search(r"^__version__ = '([^'\n]+)'$", text, re.MULTILINE)
            if found:
                return found.group(1)
    import torchvision

    return torchvision.__version__


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


def names_in(options, key: str = "name") -> list[str]:
    """Every ``name`` value in a nested configuration (a method may name auxiliary methods)."""
    out = []
    if isinstance(options, dict):
        if isinstance(options.get(key), str):
            out.append(options[key])
        for value in options.values():
            out += names_in(value, key)
    elif isinstance(options, list):
        for value in options:
            out += names_in(value, key)
    return out


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a Slurm task, ``taskset`` or a container
    limit), not the machine's ``os.cpu_count()``: the one count every thread share is taken from."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform (macOS)
        return max(1, os.cpu_count() or 1)


def run_code(config: dict, roots: tuple[str, ...] = (code.TRAINING_ROOT,), with_bytes: bool = True) -> dict[str, dict]:
    """{module: {path, sha256, normalized}} of every module a run executes (``code.executed_modules``): the
    roots (the engine; the stage-2 driver for a stage-2 fit) and the modules of its method (and any method it
    names, e.g. BAPE's auxiliary one), dataset, backbone, sampler and tune mode, with everything they import from
    ltbench or their own package. Status compares these with the files on disk (``identity.code_state``)."""
    wanted = [(registry.METHODS, n) for n in names_in(config.get("method"))]
    wanted += [(registry.DATASETS, config["data"]["name"]), (registry.BACKBONES, config["backbone"]["name"])]
    wanted.append((registry.SAMPLERS, config["sampler"]["name"]))
    if isinstance(config["backbone"].get("tune"), dict):  # a pretrained backbone's tune mode (a plugin's too)
        wanted.append((registry.TUNE_MODES, config["backbone"]["tune"]["name"]))
    plugins = [reg.entry(name).module for reg, name in wanted if name in reg]
    return modules_code(list(roots) + plugins, with_bytes)


def modules_code(roots: list[str], with_bytes: bool = True) -> dict[str, dict]:
    """What a result records of the code executed from ``roots``, read from this machine's files (a plugin
    package is found where this process imported it from): ``code.code_record`` of every module that is not
    installed (``identity.package_kind``), the version of each installed distribution they import, and the
    data files they name (``identity.data_files``)."""
    tops = {r.split(".")[0] for r in roots}  # the engine's and the plugins' packages: hashed wherever they are
    kept = kept_code_work()
    found, outside = code.executed_modules(roots, identity.source_reader(),
                                           lambda top: top in tops or identity.package_kind(top) == "hashed")
    installed = {top for top in outside if identity.package_kind(top) == "installed"}
    out = {**code.code_record(found, with_bytes), **identity.data_files(found),
           **identity.distribution_versions(installed)}
    keep_code_work(kept)
    return out


CODE_WORK_CACHE = ".ltbench-code-work.json"
_code_work_read: list[bool] = []


def kept_code_work() -> dict | None:
    """What earlier processes kept of the work ``modules_code`` repeats at every run's start (0.3 s of parsing
    and 0.3 s of reading installed distributions' files, on 2 cores): each source's parse by its sha256
    (``code.known_parses``) and which distribution provides each top-level package
    (``identity.known_distributions``), kept for the sys.path and site-packages folders it was made under
    (``_site_key``). Read once per process (``caches.memo``); None when read already."""
    if _code_work_read:
        return None
    _code_work_read.append(True)
    kept = caches.memo(store.cache_home() / CODE_WORK_CACHE, _site_key(), lambda: None) or {}
    if kept:
        code.known_parses(kept["parses"])
        identity.known_distributions(kept["distributions"])
    return kept


def keep_code_work(kept: dict | None) -> None:
    """Write the cache ``kept_code_work`` reads, when this process parsed a source it did not hold (best effort)."""
    if kept is None or not code.made_new_parses():
        return
    caches.memo(store.cache_home() / CODE_WORK_CACHE, _site_key(), lambda: {
        "parses": code.parse_entries(), "distributions": identity.distributions_map()}, refresh=True)


def _site_key() -> list[str]:
    """sys.path and the mtime of each site-packages folder on it: installing, upgrading or removing a package
    renames a ``*.dist-info`` folder there, which changes which distribution provides a package."""
    return sys.path + [f"{folder}:{os.stat(folder).st_mtime_ns}" for folder in sys.path
                       if folder.endswith(("site-packages", "dist-packages")) and os.path.isdir(folder)]


def numerics(device, *, precision: str, compile: str = "off", channels_last: bool = False,
             threads_from: str, world_size: int = 1) -> dict:
    """The numerics a result was computed under: what decides its floating-point numbers besides its run id
    (docs/results-schema.md). ``device``: the torch device it ran on; precision, compile and channels_last:
    the run's train: settings (a stage-2 fit: its feature dtype); ``threads_from``: which rule set the
    intra-op thread count (``thread_count``)."""
    import torch  # lazy: only a training process records numerics; status and tables never import torch

    cuda = device.type == "cuda"
    return {
        "device": device.type,
        "device_model": torch.cuda.get_device_name(device) if cuda else cpu_model(),
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "threads_from": threads_from,
        "torch": torch.__version__,
        "torchvision": torchvision_version(),
        **kernel_libraries(torch.__config__.show()),
        "mkldnn": mkldnn_settings(torch),
        "kernel_env": kernel_environment(os.environ),
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
        "precision": precision,
        "compile": compile,
        "channels_last": channels_last,
        "world_size": world_size,
        "threads_per_epoch": None,  # the thread count of each epoch, when it changed during the run (engine)
    }


def kernel_environment(env) -> dict[str, str]:
    """The variables of ``identity.KERNEL_ENV`` that are set (an unset one leaves the library's default)."""
    return {name: env[name] for name in identity.KERNEL_ENV if name in env}


def cpu_id() -> str | None:
    """'GenuineIntel 6/207/2 flags 3f2a9c1e0b7d': vendor, family/model/stepping and a hash of the feature flags
    of the first CPU in /proc/cpuinfo. A VM's model string ('Intel(R) Xeon(R) Processor') covers several CPU
    generations, and oneDNN and MKL pick their kernels from the features the CPU reports; None off Linux."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    flags = fields.get("flags") or fields.get("Features")  # x86 / ARM
    if not flags:
        return None
    vendor = fields.get("vendor_id") or fields.get("CPU implementer") or "?"
    kind = "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")) if "vendor_id" in fields \
        else "/".join(fields.get(k, "?") for k in ("CPU architecture", "CPU variant", "CPU part", "CPU revision"))
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]
    return f"{vendor} {kind} flags {digest}"


def kernel_libraries(config_text: str) -> dict:
    """{'blas': 'mkl 2024.2-Product Build 20240605', 'onednn': 'v3.12.0 80afa710'} from ``torch.__config__.show()``:
    the BLAS and oneDNN builds torch links (a wheel fixes them with its version; a source build need not)."""
    blas = re.search(r"BLAS_INFO=([\w.-]+)", config_text)
    mkl = re.search(r"Math Kernel Library Version (.+?) for ", config_text)
    onednn = re.search(r"(?:MKL-DNN|oneDNN) (v[\w.]+)(?: \(Git Hash (\w{8}))?", config_text)
    return {"blas": " ".join(filter(None, [blas and blas.group(1), mkl and mkl.group(1)])) or None,
            "onednn": " ".join(filter(None, onednn.groups())) if onednn else None}


def mkldnn_settings(torch) -> dict:
    """torch's switches for oneDNN on the CPU: whether it is used, deterministic, and the fp32 precision it may
    use for matmul and convolution ('none': fp32; 'bf16'/'tf32': reduced)."""
    backend = torch.backends.mkldnn
    out = {"enabled": bool(backend.is_available() and backend.enabled),
           "deterministic": bool(getattr(backend, "deterministic", False))}
    for op in ("matmul", "conv"):
        precision = getattr(getattr(backend, op, None), "fp32_precision", None)
        if precision is not None:
            out[f"{op}_fp32_precision"] = str(precision)
    return out


THREADS_ENV = "LTBENCH_THREADS"  # set by the local pool for each worker: its share of the usable cores


def thread_count(configured: int | None, device_type: str, env) -> tuple[int, str]:
    """(torch intra-op threads for a run, which rule chose them). In this order:

    * ``train.threads`` when set: the user's choice, recorded;
    * on the CPU, 1: the thread count changes how reductions are split and so the numbers (70.06 against
      68.86 for one run id), so it is pinned rather than left to the VM's cores or launcher.jobs;
    * on a GPU (host-side work only): a pool worker's share (``LTBENCH_THREADS``, set by the pool, so a
      ``runs_per_gpu`` worker never takes the whole Slurm allocation it inherits), else the Slurm task's
      ``SLURM_CPUS_PER_TASK``, else the cores this process may use (``usable_cores``).
    """
    if configured:
        return int(configured), "train.threads"
    if device_type == "cpu":
        return 1, "pinned: 1 on the CPU while train.threads is unset"
    for name, rule in ((THREADS_ENV, "the pool worker's share of the cores"),
                       ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_PER_TASK")):
        value = str(env.get(name) or "")
        if value.isdigit() and int(value) > 0:
            return int(value), rule
    return usable_cores(), "the cores this process may use"
