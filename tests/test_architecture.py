"""Module boundaries: the core never imports the built-in methods."""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "ltbench"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_never_imports_methods():
    offenders = {str(p.relative_to(CORE)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "methods")
                 for p in CORE.rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def dynamic_imports(path: Path) -> list[str]:
    """String arguments of import_module(...) / __import__(...) calls, however they are spelled
    (importlib.import_module, a bare import_module, single or double quotes, f-string heads)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append(arg.value)
        elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            out.append(str(arg.values[0].value))
    return out


def test_core_loads_no_particular_method_by_name():
    """The core finds methods through the registry's discovery, never by loading a methods module itself."""
    offenders = {str(p.relative_to(CORE)): [m for m in dynamic_imports(p) if m.split(".")[0] == "methods"]
                 for p in CORE.rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_dynamic_import_check_sees_every_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import importlib\nfrom importlib import import_module\n"
                      "importlib.import_module('methods.la')\nimport_module(\"methods\")\n"
                      "__import__(f'methods.{x}')\nimportlib.import_module('ltbench.recipe')\n")
    assert dynamic_imports(sample) == ["methods.la", "methods", "methods.", "ltbench.recipe"]


# --------------------------------------------------------------------------------------------
# The layer rule (docs/architecture.md): cli -> launch -> recipe/report -> runner -> engine ->
# data, backbones, methods -> registry, config, store. An import may go down or sideways, never up.

ROOT = CORE.parent
LAYERS = {  # rank: modules (dotted prefixes); a module takes the rank of its longest matching prefix
    6: ("ltbench.cli", "ltbench.__main__"),
    5: ("ltbench.launch", "ltbench.slurm", "ltbench.progress"),
    4: ("ltbench.recipe", "ltbench.report", "ltbench.plots", "ltbench.runlines"),
    3: ("ltbench.runner", "ltbench.features", "ltbench.posthoc_runs"),
    2: ("ltbench.engine", "ltbench.checkpoint", "ltbench.selection", "ltbench.contract", "ltbench.provenance"),
    1: ("ltbench.data", "ltbench.backbones", "ltbench.experts", "ltbench.method", "ltbench.posthoc", "methods", "ltbench.evaluation", "ltbench.predictions",
        "ltbench.significance", "ltbench.literature", "ltbench.distributed", "ltbench.samplers"),
    0: ("ltbench.registry", "ltbench.config", "ltbench.store", "ltbench.errors", "ltbench.record", "ltbench.runspec",
        "ltbench.identity", "ltbench.priors", "ltbench.seeding", "ltbench.loggers", "ltbench.safe_read", "ltbench"),
}
TORCH_FREE = ("ltbench.report", "ltbench.store", "ltbench.significance", "ltbench.literature", "ltbench.plots",
              "ltbench.evaluation", "ltbench.predictions", "ltbench.recipe", "ltbench.selection", "ltbench.record",
              "ltbench.runspec", "ltbench.identity", "ltbench.priors", "ltbench.samplers", "ltbench.seeding",
              "ltbench.loggers", "ltbench.progress", "ltbench.safe_read", "ltbench.runlines")


def all_modules() -> dict[str, Path]:
    out = {}
    for path in sorted([*CORE.rglob("*.py"), *(ROOT / "methods").rglob("*.py")]):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def rank_of(module: str) -> int:
    best, rank = "", None
    for r, prefixes in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, r
    assert rank is not None, f"{module}: in no layer; add it to LAYERS in tests/test_architecture.py"
    return rank


def imports_of(module: str, path: Path, top_level_only: bool = False) -> set[str]:
    """Modules ``module`` imports (absolute names, relative imports resolved; ``from a import b`` counts
    a.b when that is a module). ``top_level_only``: skip function bodies (what runs at import time)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - child.level + 1] if child.level else []
                name = ".".join(base + ([child.module] if child.module else []))
                found.add(name)
                found.update(f"{name}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_import_runs_back_up_the_layers():
    modules = all_modules()
    upward = []
    for module, path in modules.items():
        for target in imports_of(module, path):
            if target in modules and rank_of(target) > rank_of(module):
                upward.append(f"{module} (layer {rank_of(module)}) imports {target} (layer {rank_of(target)})")
    assert not upward, "\n".join(upward)


def test_every_module_has_a_layer():
    for module in all_modules():
        rank_of(module)


def import_time_closure(start: str, modules: dict[str, Path]) -> dict[str, str]:
    """Every project module (and 'torch') loading ``start`` runs, each mapped to the module importing it."""
    seen, pending = {start: start}, [start]
    while pending:
        current = pending.pop()
        for target in imports_of(current, modules[current], top_level_only=True):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
                name = ".".join(parts[:i])
                if name in modules and name not in seen:
                    seen[name] = current
                    pending.append(name)
                elif i == 1 and name == "torch":
                    seen.setdefault("torch", current)
    return seen


def test_results_side_never_imports_torch_at_import_time():
    """report/store/significance/literature/plots (and what they import) load without torch, so tables and
    status work on a login node; lazy imports inside functions (e.g. the engine for 'ltbench data') are
    allowed."""
    modules = all_modules()

    for module in modules:
        if any(module == p or module.startswith(p + ".") for p in TORCH_FREE):
            reached = import_time_closure(module, modules)
            assert "torch" not in reached, f"{module} imports torch at import time (through {reached['torch']})"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    sample = tmp_path / "store_like.py"
    sample.write_text("from ltbench import engine\n\ndef later():\n    from .runner import run_one\n")
    found = imports_of("ltbench.store_like", sample)
    assert {"ltbench.engine", "ltbench.runner.run_one", "ltbench.runner"} <= found
    assert rank_of("ltbench.engine") > rank_of("ltbench.store")
    assert imports_of("ltbench.store_like", sample, top_level_only=True) == {"ltbench", "ltbench.engine"}
    modules = all_modules()
    assert "torch" in import_time_closure("ltbench.engine", modules)
    assert "ltbench.data.base" in import_time_closure("ltbench.data.cifar", modules)
