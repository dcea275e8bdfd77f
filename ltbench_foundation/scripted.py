"""The parameters of a TorchScript archive (OpenAI's CLIP ``.pt`` files), read as data: no code of the archive runs.

Why not ``torch.jit.load``: it compiles the archive's ``code/`` and calls each class's ``__setstate__``, so a
weights file could loop forever or do anything TorchScript can. A TorchScript archive is a zip: ``data.pkl``
pickles the module tree, each tensor's bytes are a member ``data/<key>``, and ``code/__torch__/...py`` declares
for each class which attributes are parameters and buffers (``__parameters__``, ``__buffers__``). So:

* ``data.pkl`` is unpickled by :class:`_DataUnpickler`, which knows four globals only: the archive's own
  classes (rebuilt as inert :class:`_Scripted` records that store their state and run nothing), the tensor
  rebuild function, the typed-storage names and ``collections.OrderedDict``; anything else (``os.system``,
  ``builtins.eval``...) is refused;
* tensor bytes are read from their members, sizes checked against what the pickle claims before any
  allocation;
* the code files are parsed (``ast``, never executed) for the two name lists, so a state dict holds what
  ``state_dict()`` would (OpenAI's text tower also keeps ``attn_mask`` tensors that are neither).
"""

from __future__ import annotations

import ast
import collections
import io
import pickle
import zipfile
from pathlib import Path

import torch

MAX_PICKLE_BYTES = 64 * 2**20  # data.pkl of ViT-G is ~100 kB: a bound, not a limit anyone meets
# torch.jit.save stores its members uncompressed, so what an archive's members hold is about its own size; a
# zip may compress, so the members read may hold more, but never more than this many times the file's size.
MAX_INFLATION = 4
STORAGE_DTYPES = {f"{name}Storage": dtype for name, dtype in (
    ("Float", torch.float32), ("Double", torch.float64), ("Half", torch.float16), ("BFloat16", torch.bfloat16),
    ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8),
    ("Byte", torch.uint8), ("Bool", torch.bool))}


class ArchiveError(ValueError):
    """The archive is not a TorchScript module tree ltbench can read as data (the message says why)."""


def is_torchscript(path: Path) -> bool:
    """A zip holding ``<name>/data.pkl`` and ``<name>/code/``: what ``torch.jit.save`` writes."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return any(n.endswith("/data.pkl") for n in names) and any("/code/" in n for n in names)


class _Scripted:
    """An object of one of the archive's classes, as data: its class name and the state the pickle gave it.
    ``__slots__``: a pickle cannot give it an attribute (such as ``__setstate__``) that pickle would then call."""

    __slots__ = ("state",)

    def __setstate__(self, state) -> None:
        self.state = state


def _scripted_class(qualname: str) -> type:
    return type("_Scripted", (_Scripted,), {"__slots__": (), "qualname_": qualname})


class _Members:
    """The archive's members, each decompressed once however often the pickle names it (a 262 kB file naming
    one member 60,000 times asked for 16 GB), all of them together at most ``budget`` bytes."""

    def __init__(self, archive: zipfile.ZipFile, budget: int):
        self.archive, self.budget, self.read = archive, budget, {}

    def __call__(self, name: str) -> bytearray:
        if name not in self.read:
            size = self.archive.getinfo(name).file_size
            if size > self.budget:
                raise ArchiveError(f"its members hold more than {MAX_INFLATION} times the file's size (at {name})")
            self.budget -= size
            self.read[name] = bytearray(self.archive.read(name))
        return self.read[name]


class _DataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, members: _Members, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.members, self.prefix = members.archive, members, prefix

    def find_class(self, module: str, name: str):
        if module.startswith("__torch__.") or module == "__torch__":
            return _scripted_class(f"{module}.{name}")
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in STORAGE_DTYPES:
            return name
        raise ArchiveError(f"its data.pkl asks for {module}.{name}, which is not a tensor (refused: it could run code)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in STORAGE_DTYPES
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):
            raise ArchiveError(f"its data.pkl names a storage as {str(pid)[:80]}")
        dtype, key, numel = STORAGE_DTYPES[pid[1]], pid[2], pid[4]
        member = f"{self.prefix}data/{key}"
        try:
            info = self.archive.getinfo(member)
        except KeyError:
            raise ArchiveError(f"{member} is missing") from None
        size = numel * torch.empty((), dtype=dtype).element_size()
        if info.file_size != size:
            raise ArchiveError(f"{member} holds {info.file_size} bytes, its tensor needs {size} (truncated?)")
        # frombuffer shares the member's bytes, as the archive's tensors share its storage: nothing more allocated
        untyped = torch.frombuffer(self.members(member), dtype=torch.uint8).untyped_storage() if size \
            else torch.UntypedStorage(0)
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` less what a weights file needs not hold: hooks and metadata."""
    if not isinstance(storage, torch.storage.TypedStorage) or hooks or metadata or type(offset) is not int \
            or not all(isinstance(x, tuple) and all(type(v) is int for v in x) for x in (size, stride)):
        raise ArchiveError("its data.pkl rebuilds a tensor from something other than a storage, sizes and strides")
    return torch._utils._rebuild_tensor(storage, offset, size, stride)


def read_torchscript(path: Path) -> dict[str, torch.Tensor]:
    """The parameters and buffers of a TorchScript archive by their state-dict names; ArchiveError when the
    archive is not one, or holds anything but tensors in its module tree."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = _Members(archive, MAX_INFLATION * Path(path).stat().st_size)
            pkl = next((n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if pkl is None:
                raise ArchiveError("has no data.pkl")
            prefix = pkl[: -len("data.pkl")]
            if archive.getinfo(pkl).file_size > MAX_PICKLE_BYTES:
                raise ArchiveError(f"its data.pkl is over {MAX_PICKLE_BYTES // 2**20} MiB")
            order = members(prefix + "byteorder").decode().strip() if prefix + "byteorder" in archive.namelist() \
                else "little"
            if order != "little":
                raise ArchiveError(f"its tensors are {order}-endian")
            root = _DataUnpickler(members(pkl), members, prefix).load()
            names = _declared_names(members, prefix)
    except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError, UnicodeDecodeError, RuntimeError,
            TypeError, AttributeError, IndexError) as exc:
        raise ArchiveError(f"is a damaged TorchScript archive ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(root, _Scripted):
        raise ArchiveError("its data.pkl does not hold a module")
    out: dict[str, torch.Tensor] = {}
    _walk(root, "", names, out, depth=0)
    return out


def _declared_names(members: _Members, prefix: str) -> dict[str, set[str]]:
    """For each class of the archive ('__torch__.a.b.Module'), the names its code declares as parameters and
    buffers: the literal lists ``__parameters__`` and ``__buffers__``, read by parsing (never executing) the code."""
    out: dict[str, set[str]] = {}
    for name in members.archive.namelist():
        if not (name.startswith(prefix + "code/") and name.endswith(".py")):
            continue
        module = name[len(prefix + "code/"):-3].replace("/", ".")
        try:
            tree = ast.parse(members(name).decode())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            declared: set[str] = set()
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                        and stmt.targets[0].id in ("__parameters__", "__buffers__"):
                    try:
                        declared |= {str(v) for v in ast.literal_eval(stmt.value)}
                    except (ValueError, TypeError, SyntaxError):
                        pass
            out[f"{module}.{cls.name}"] = declared
    return out


def _walk(obj: _Scripted, prefix: str, names: dict[str, set[str]], out: dict, depth: int) -> None:
    if depth > 200:
        raise ArchiveError("its module tree is nested over 200 levels")
    state = obj.state if isinstance(getattr(obj, "state", None), dict) else {}
    declared = names.get(type(obj).qualname_, set())
    for key, value in state.items():
        if isinstance(value, _Scripted):
            _walk(value, f"{prefix}{key}.", names, out, depth + 1)
        elif isinstance(value, torch.Tensor) and key in declared:
            out[prefix + key] = value
