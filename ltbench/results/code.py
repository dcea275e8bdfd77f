"""Which source a result was computed by: every module a run executes, hashed after normalisation.

Why normalised: a result is stale when the *computation* that made it has changed, not when a comment or a
docstring has. So each module is hashed as its syntax tree with docstrings (and every other bare string
statement, which executes nothing) left out; comments are not in the tree at all. The tree is written out
by ``canonical_dump`` (node types and non-empty fields only), not ``ast.dump``, whose text changes between
Python versions (3.13 leaves empty fields out, 3.12 added ``type_params``): a result recorded under one
Python is checked under another.

Why a static closure: the modules a run executes are its roots (the training engine, or the stage-2
driver, and the plugins its configuration names) and, transitively, every module they import that is not
installed (the harness, a plugin package, a helper package of the user's on ``sys.path``), function-level
imports included; installed distributions are recorded by their version instead, and data files a module
names (a string constant naming a file or folder next to it: a text classifier's class-name lists) by their bytes. It is read from the source text, never
from what a process happens to have imported, so the same function gives the same set in a worker and in
``ltbench status``. Modules that only
record, report or launch (``EXCLUDED``) are left out: editing a table's layout never makes a run stale.

No torch, no import of the modules hashed: status and tables check code without training anything.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from typing import Callable

# What a record's ``code_scope`` says when its ``code`` covers every module the run executed (core and
# plugins). A record whose code_scope is null (migrated from before it) hashed only its plugins' bytes: code unknown.
CODE_SCOPE = "computation/1"
TRAINING_ROOT = "ltbench.train.engine"  # a trained run executes the engine and what it imports
STAGE2_ROOT = "ltbench.stage2.posthoc_runs"  # a stage-2 fit: the driver, the feature cache and the engine
# Modules that never change what a run computes: the record and its reading, reports, launchers, the CLI,
# error texts, where scalars are also logged, the plugin contract check; of installed ones, the two below.
EXCLUDED = ("ltbench.results", "ltbench.report", "ltbench.run", "ltbench.recipe", "ltbench.cli",
            "ltbench.__main__", "ltbench.errors", "ltbench.contract", "ltbench.train.loggers",
            "tqdm", "submitit")  # a progress bar; the Slurm job environment a distributed run reads its rank from

Reader = Callable[[str], "bytes | None"]  # a path relative to the folder holding the packages -> its bytes


def module_path(module: str, package: bool = False) -> str:
    """'ltbench.train.engine' -> 'ltbench/train/engine.py' ('.../__init__.py' for a package)."""
    base = module.replace(".", "/")
    return f"{base}/__init__.py" if package else f"{base}.py"


def is_excluded(module: str) -> bool:
    return any(module == e or module.startswith(e + ".") for e in EXCLUDED)


# Class attributes that declare how a method is tuned, never what it computes (ltbench/search.py): a method's
# search space changing leaves its finished runs current, as a docstring does.
DECLARATIONS = ("search_space",)


def _strip_strings(tree: ast.AST) -> ast.AST:
    """Remove docstrings, every other statement that is a bare string constant (it executes nothing), and a
    class's ``DECLARATIONS``."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                 and isinstance(s.value.value, str))
                         and not (isinstance(node, ast.ClassDef) and _declares(s))]
    return tree


def _declares(statement: ast.stmt) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, ast.AnnAssign) else []
    return len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id in DECLARATIONS


def canonical_dump(node) -> str:
    """The tree as text: node type and its fields, leaving out fields that are None or empty (so the text is
    the same on every supported Python version) and positions (so moving code by a line changes nothing)."""
    if isinstance(node, ast.AST):
        parts = [type(node).__name__]
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or (isinstance(value, list) and not value):
                continue
            parts.append(f"{name}={canonical_dump(value)}")
        return "(" + " ".join(parts) + ")"
    if isinstance(node, list):
        return "[" + ",".join(canonical_dump(x) for x in node) + "]"
    return repr(node)


# sha256 (hex) of a source -> (normalised hash or None, its imports or None, string constants that may name a
# file): one parse per source and process (a stage-2 grid records the same modules for each of its hundreds of
# settings), and across processes through ``known_parses`` / ``parse_entries`` (a worker's start, 0.3 s).
_parsed: dict[str, tuple] = {}
_by_package: dict[tuple[str, str], frozenset] = {}  # (source hash, package) -> imported names
_new_parses: list[str] = []  # parsed by this process, not known from a cache


def _parse(source: bytes) -> tuple:
    """(normalised hash or None, imports or None, string constants that may name a file) of a source. An
    import is ``("import", names)`` or ``("from", level, module or None, names)``: plain data, so a parse
    can be kept between processes."""
    key = hashlib.sha256(source).hexdigest()
    if key not in _parsed:
        _parsed[key] = _parse_tree(source)
        _new_parses.append(key)
    return _parsed[key]


def _parse_tree(source: bytes) -> tuple:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None, None, frozenset()
    imports = tuple(("import", tuple(a.name for a in node.names)) if isinstance(node, ast.Import)
                    else ("from", node.level, node.module, tuple(a.name for a in node.names))
                    for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
    names = frozenset(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                      and isinstance(node.value, str) and _may_name_a_file(node.value))
    return hashlib.sha256(canonical_dump(_strip_strings(tree)).encode()).hexdigest(), imports, names


def parse_entries() -> dict[str, list]:
    """Every parse this process knows, as JSON data ({source sha256: [normalised hash, imports, names]}): what
    a cache keeps for ``known_parses``."""
    return {k: [d, None if i is None else [[*x[:-1], list(x[-1])] for x in i], sorted(n)]
            for k, (d, i, n) in _parsed.items()}


def made_new_parses() -> bool:
    """Whether this process parsed a source no cache gave it (so a cache written now would hold more)."""
    return bool(_new_parses)


def known_parses(entries: dict) -> None:
    """Take parses kept by earlier processes (``parse_entries``, from a sealed cache: ltbench/results/caches.py)."""
    for key, (digest, imports, names) in entries.items():
        imports = None if imports is None else tuple((*x[:-1], tuple(x[-1])) for x in imports)
        _parsed.setdefault(key, (digest, imports, frozenset(names)))


def _may_name_a_file(text: str) -> bool:
    """'classnames', 'splits/train.txt': a relative path without spaces, parents or newlines."""
    return 0 < len(text) < 200 and not text.startswith(("/", ".")) and not any(c in text for c in " \n\t\\:*{}")


def file_names(source: bytes) -> frozenset[str]:
    """The string constants of a module that could name a file or folder next to it (``data_files``)."""
    return _parse(source)[2]


def normalized_hash(source: bytes) -> str | None:
    """sha256 of the module's syntax tree without docstrings and comments; None when it does not parse."""
    return _parse(source)[0]


def module_file(module: str, read: Reader) -> tuple[str, bytes] | tuple[None, None]:
    """(relative path, bytes) of a module: 'a/b.py' or 'a/b/__init__.py'; (None, None) when neither exists
    (an imported name that is a class or a function, not a module)."""
    for rel in (module_path(module), module_path(module, package=True)):
        data = read(rel)
        if data is not None:
            return rel, data
    return None, None


def imported_modules(source: bytes, module: str, is_package: bool) -> set[str]:
    """Every name a module's source imports, at any depth of the file: 'a.b' for ``import a.b``,
    'pkg.c' and 'pkg.c.d' for ``from .c import d`` (d may be a module)."""
    _, imports, _ = _parse(source)
    package = module if is_package else module.rpartition(".")[0]
    if imports is None:
        return set()
    memo = (hashlib.sha256(source).hexdigest(), package)
    if memo in _by_package:
        return set(_by_package[memo])
    names = set()
    for item in imports:
        if item[0] == "import":
            names |= set(item[1])
            continue
        _, level, source_module, imported = item
        try:
            base = importlib.util.resolve_name("." * level + (source_module or ""), package)
        except (ImportError, ValueError):
            continue
        names |= {base} | {f"{base}.{name}" for name in imported}
    _by_package[memo] = frozenset(names)
    return names


def executed_modules(roots: list[str], read: Reader, hashed: Callable[[str], bool]
                     ) -> tuple[dict[str, tuple[str, bytes]], set[str]]:
    """({module: (relative path, bytes)}, top-level names imported from elsewhere): the roots and,
    transitively, every module whose top-level package ``hashed`` accepts (ltbench, the plugin folders, any
    other package that is not installed: ``identity.hashed_package``) that they import, with the packages
    that contain them (whose ``__init__`` runs first), less ``EXCLUDED``. The second part names what they
    import from elsewhere (the standard library, installed distributions: recorded by version)."""
    found: dict[str, tuple[str, bytes]] = {}
    outside: set[str] = set()
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if name in seen or is_excluded(name):
            continue
        seen.add(name)
        if not hashed(name.split(".")[0]):
            outside.add(name.split(".")[0])
            continue
        rel, data = module_file(name, read)
        if rel is None:
            continue
        found[name] = (rel, data)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(imported_modules(data, name, rel.endswith("__init__.py")))
    return found, outside


def code_record(modules: dict[str, tuple[str, bytes]], with_bytes: bool = True) -> dict[str, dict]:
    """What a result records of each module: the sha256 of its normalised tree (the one the stale rule
    compares), its relative path only when the module's name does not give it (a package's ``__init__``),
    and, for a run (``with_bytes``), the sha256 of its bytes. A stage-2 result leaves the bytes out: a grid
    writes hundreds of them per run, and only the normalised hash decides anything."""
    out = {}
    for name, (rel, data) in sorted(modules.items()):
        entry = {"normalized": normalized_hash(data)}
        if rel != module_path(name):
            entry["path"] = rel
        if with_bytes:
            entry["sha256"] = hashlib.sha256(data).hexdigest()
        out[name] = entry
    return out
