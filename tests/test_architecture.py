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


def test_core_mentions_no_particular_method_by_module():
    for p in CORE.rglob("*.py"):
        assert "import_module(\"methods" not in p.read_text(), p
