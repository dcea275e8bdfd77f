"""The core (ltbench/) knows no particular method, in code as well as in imports.

tests/test_architecture.py proves the core never imports methods/. This file proves more: no module of
ltbench/ names a registered method (training or stage-2) in code, i.e. in an identifier (a variable,
attribute, function, class or argument name) or in a string literal, so no core rule can be about one
method (``if name == "bape"``, ``getattr(method, "project")``, a label table keyed on one method's
statistic). Docstrings and comments are prose about the code and are not checked.

A name is matched case-insensitively as a whole token or as an underscore-separated part of one
(``bape``, ``BAPE``, ``bape_scores``, ``tau_norm``), never inside a longer word (``label`` is not ``la``).
What remains is listed in ALLOWED, each with the reason it is not about the method.
"""

import ast
import re
from pathlib import Path

from ltbench.registry import METHODS, POSTHOC

CORE = Path(__file__).resolve().parents[1] / "ltbench"

_PAPER_PROTOCOL = ("a data protocol named after the paper that defined it (LDAM-DRW's CIFAR-LT subset, the shifted "
                   "test sets of SADE and LADE: data option shift.method), not the method")
_EXAMPLE = "an example in a user-facing error message (any registered name would do; this one exists)"
_HISTORY = ("the record history (results/migrate.py): the options each method gained after its results were recorded, "
            "as data applied once by 'ltbench migrate'; no rule of a run reads it")

ALLOWED = {  # (module path under ltbench/, method name) -> why the name there is not about the method
    **{("results/migrate.py", name): _HISTORY for name in ("bape", "la", "la_posthoc", "proco", "sade")},
    ("config.py", "cosine"): "the cosine learning-rate schedule (optim.schedule), not the cosine classifier",
    ("train/engine.py", "cosine"): "the cosine learning-rate schedule (optim.schedule), not the cosine classifier",
    ("report/table_text.py", "vs"): "the English 'vs' in a table's note ('n 3 vs 2'), not the VS loss",
    ("recipe/selection.py", "ce"): "an example value in the --where error message ('e.g. 10, 0.1, true or ce')",
    ("report/plan.py", "vs"): "the English 'vs' in a plan line ('LA vs CE'), not the VS loss",
    ("report/verify.py", "vs"): "the English 'vs' in a verdict's interval ('[-0.3, +0.4] vs ±1'), not the VS loss",
    ("results/protocol.py", "ldam"): _PAPER_PROTOCOL,
    ("results/protocol.py", "ldam_drw"): _PAPER_PROTOCOL,
    ("results/protocol.py", "sade"): _PAPER_PROTOCOL,
    ("data/cifar.py", "ldam"): _PAPER_PROTOCOL,
    ("data/profile.py", "ldam"): _PAPER_PROTOCOL,
    ("data/fashion_mnist.py", "ldam"): _PAPER_PROTOCOL,
    ("data/shift.py", "ldam"): _PAPER_PROTOCOL,
    ("data/shift.py", "sade"): _PAPER_PROTOCOL,
    ("data/shift.py", "lade"): _PAPER_PROTOCOL,
    ("recipe/__init__.py", "ldam"): "an example recipe name in an error message (cifar10_lt_ldam)",
    ("cli.py", "tau_norm"): _EXAMPLE,
    ("posthoc.py", "tau_norm"): _EXAMPLE,
}


def method_names() -> set[str]:
    return {n.lower() for n in (*METHODS.names(), *POSTHOC.names())}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """Every string that stands alone as a statement: module/class/function docstrings and the attribute
    docstrings under dataclass fields. Prose, like comments."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _tokens(node: ast.AST, prose: set[int]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
        return re.findall(r"[A-Za-z0-9_]+", node.value)
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.split(".")[-1]]
    return []


def method_mentions(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, method name) for every identifier or string literal in ``path`` that names a method."""
    tree = ast.parse(path.read_text())
    prose = _docstring_nodes(tree)
    patterns = {name: re.compile(rf"(^|_){re.escape(name)}(_|$)") for name in names}
    found = []
    for node in ast.walk(tree):
        for token in _tokens(node, prose):
            found += [(getattr(node, "lineno", 0), name) for name, pattern in patterns.items()
                      if pattern.search(token.lower())]
    return sorted(set(found))


def core_mentions() -> dict[tuple[str, str], list[int]]:
    names = method_names()
    out: dict[tuple[str, str], list[int]] = {}
    for path in sorted(CORE.rglob("*.py")):
        for line, name in method_mentions(path, names):
            out.setdefault((str(path.relative_to(CORE)), name), []).append(line)
    return out


def test_the_core_names_no_registered_method_in_code():
    offenders = {f"ltbench/{module}:{lines} names '{name}'": "" for (module, name), lines in core_mentions().items()
                 if (module, name) not in ALLOWED}
    assert not offenders, ("a core module names a particular method in code; make the rule generic (a capability "
                           f"the method declares, e.g. Method.feature_spaces), or allow it in ALLOWED with the reason: "
                           f"{sorted(offenders)}")


def test_every_allowance_is_still_needed():
    """An allowance whose mention is gone is removed, so ALLOWED stays the true list of what remains."""
    stale = sorted(set(ALLOWED) - set(core_mentions()))
    assert not stale, f"remove these entries from ALLOWED (the core no longer names the method there): {stale}"


def test_the_check_sees_a_method_named_in_code(tmp_path):
    """It can fail: identifiers, attributes and string literals naming a method are found, in any case and as
    an underscore-separated part; docstrings, comments and longer words are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""BAPE and la in a docstring are prose."""\n'
        "def f(method, spec):\n"
        "    '''tau_norm here too.'''\n"
        "    project = getattr(method, 'project', None)  # bape in a comment\n"
        "    if spec['name'] == 'bape':\n"
        "        return method.bape_scores\n"
        "    label = 'Label: BAPE (ours)'\n"
        "    ldam_subset = spec['la_posthoc']\n"
        "    return label, ldam_subset, project\n")
    found = method_mentions(sample, {"bape", "la", "la_posthoc", "ldam", "tau_norm", "project"})
    assert found == [(4, "project"), (5, "bape"), (6, "bape"), (7, "bape"), (8, "la"), (8, "la_posthoc"),
                     (8, "ldam"), (9, "ldam"), (9, "project")]


def test_the_check_knows_the_registered_names():
    names = method_names()
    assert {"bape", "la", "ce", "bape_refit", "tau_norm"} <= names
