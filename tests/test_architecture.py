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
