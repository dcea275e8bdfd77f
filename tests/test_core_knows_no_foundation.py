"""The foundation track is a plugin package (ltbench_foundation/, docs/foundation.md): the core (ltbench/ and the
built-in methods/) knows nothing of it, and works without it.

"Knows nothing" is checked on the text, comments and docstrings included: no file of the core names CLIP,
open_clip, timm or the package (so no import of it either, static or by a string). What must remain is listed in
ALLOWED with the reason. The core reaches the package's backbones only through the Backbone hooks
(docs/adding-a-backbone.md) and its tune modes through ``TuneMode.check``, as it reaches a third-party plugin.
"""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ltbench import registry
from tests.conftest import ROOT

WORDS = re.compile(r"\b(open_?clip|clip|timm|ltbench_foundation)\b|ltbench[./](pretrained|devtools)\b", re.I)
ALLOWED = {  # (file or folder under the repository root, word in lower case) -> why it stays
    ("ltbench/claims/", "timm"): "a published paper's note on which weights its rows used: the literature's "
                                 "numbers (data), not code",
}


def allowed(file: str, word: str) -> bool:
    return any(file.startswith(place) and word == w for place, w in ALLOWED)


def mentions(text: str) -> dict[str, list[int]]:
    """{word in lower case: line numbers} of every mention in ``text``."""
    found: dict[str, list[int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for match in WORDS.finditer(line):
            found.setdefault(match[0].lower(), []).append(number)
    return found


def core_mentions() -> dict[tuple[str, str], list[int]]:
    return {(path.relative_to(ROOT).as_posix(), word): lines for path in core_files()
            for word, lines in mentions(path.read_text()).items()}


def core_files() -> list[Path]:
    return sorted(p for folder in ("ltbench", "methods") for p in (ROOT / folder).rglob("*")
                  if p.is_file() and p.suffix in (".py", ".yaml", ".md", ".txt"))


def test_the_core_never_mentions_the_foundation_track():
    offenders = {f"{f}:{lines} '{word}'" for (f, word), lines in core_mentions().items() if not allowed(f, word)}
    assert not offenders, ("the core names the foundation track; ask a Backbone hook instead (docs/adding-a-backbone.md), "
                           f"or allow it in ALLOWED with the reason: {sorted(offenders)}")


def test_every_allowance_is_still_needed():
    found = set(core_mentions())
    assert all(any(f.startswith(place) and w == word for f, w in found) for place, word in ALLOWED)


def test_the_check_sees_each_spelling():
    text = ("# zero-shot CLIP\nimport open_clip\nfrom timm.models import x\n'ltbench_foundation.prompts'\n"
            "from ltbench.pretrained import tuning\n# clipped, clipboard, timmy, cliproad: other words\n")
    assert mentions(text) == {"clip": [1], "open_clip": [2], "timm": [3], "ltbench_foundation": [4],
                              "ltbench.pretrained": [5]}


def test_an_entry_point_whose_package_is_not_installed_is_named_not_fatal(monkeypatch):
    """Installed metadata naming a package that is not there (the foundation package left out) leaves the core
    working: the entry point is listed as not loaded, with why. A plugin whose own package is there but whose
    import fails is still an error naming it."""
    gone = importlib.metadata.EntryPoint("foundation", "ltbench_gone_pkg.methods", "ltbench.methods")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [gone] if group == "ltbench.methods" else [])
    monkeypatch.setattr(registry, "_entry_points_done", False)
    monkeypatch.setattr(registry, "_entry_point_labels", [])
    registry._load_entry_points()
    assert registry._entry_point_labels == ["entry point 'foundation' (ltbench.methods) of unknown distribution "
                                            "(not loaded: its package ltbench_gone_pkg is not installed)"]
    broken = importlib.metadata.EntryPoint("broken", "json.no_such_module", "ltbench.methods")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [broken] if group == "ltbench.methods" else [])
    monkeypatch.setattr(registry, "_entry_points_done", False)
    with pytest.raises(registry.RegistryError, match="could not load entry point 'broken'.*json.no_such_module"):
        registry._load_entry_points()


def test_the_core_lists_and_runs_without_the_foundation_package(tmp_path):
    """With ltbench_foundation made unimportable, `ltbench list methods` still works and lists the built-in methods
    and no foundation method; a recipe naming lift is refused with one line that names the missing package when
    this installation declares it."""
    code = ("import sys\n"
            "class Gone:  # as if the package were not installed\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'ltbench_foundation':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Gone())\n"
            "from ltbench.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    # its own caches: its listing (without the package) is never served to the suite's later commands
    env = {**os.environ, "LTBENCH_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code, "list", "methods"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^la\b", out.stdout, re.M) and not re.search(r"^(lift|zero_shot)\b", out.stdout, re.M)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ndata: {name: synthetic_lt}\nbackbone: {name: resnet8}\nmethod: {name: lift}\n")
    out = subprocess.run([sys.executable, "-c", code, "run", str(recipe), "--dry-run", "--results", str(tmp_path / "x")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2 and "unknown method 'lift'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    if any(e.value.startswith("ltbench_foundation") for e in importlib.metadata.entry_points(group="ltbench.methods")):
        assert "(not loaded: its package ltbench_foundation is not installed)" in out.stderr, out.stderr


def test_the_caches_see_an_edit_of_the_foundation_package(monkeypatch):
    """The package ships in this checkout beside ltbench/: editing it (a tune mode's new option changes run ids)
    invalidates every cache, as an edit of ltbench/ does (caches.code_version)."""
    from ltbench.results import caches

    def version() -> str:
        monkeypatch.setattr(caches, "_code_version", [])
        return caches.code_version()

    path = ROOT / "ltbench_foundation" / "tuning.py"
    st = path.stat()
    before = version()
    try:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert version() != before
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert version() == before


def test_without_the_extra_a_foundation_backbone_is_one_line(monkeypatch, tmp_path):
    """open_clip not installed (the foundation extra left out): checking the weights before the first run names
    the library and the extra in one line (exit 2), not a traceback from inside the model's constructor."""
    import torch

    from ltbench.errors import LtbenchError
    from ltbench.registry import BACKBONES

    weights = tmp_path / "w.pt"
    torch.save({}, weights)
    monkeypatch.setitem(sys.modules, "open_clip", None)
    monkeypatch.setitem(sys.modules, "open_clip.model", None)
    spec = {"name": "clip_vit", "weights": str(weights), "tune": "linear"}
    with pytest.raises(LtbenchError, match=r"^backbone clip_vit needs open_clip\S*, which is not installed: "
                                           r"pip install 'ltbench\[foundation\]'$"):
        BACKBONES.get("clip_vit").check_weights(BACKBONES.config(spec, "backbone"))


def test_the_tune_mode_check_is_no_part_of_a_runs_code():
    """TuneMode.check imports the package's contract by name, so editing the check leaves the package's runs
    current, as an edit of ltbench/contract.py does (results/code.py reads import statements)."""
    from ltbench.results import provenance

    recorded = provenance.modules_code(["ltbench_foundation.clip"])
    assert {"ltbench_foundation.clip", "ltbench_foundation.tuning", "ltbench_foundation.backbone"} <= set(recorded)
    assert not {"ltbench_foundation.contract", "ltbench.contract"} & set(recorded)


def test_a_tune_mode_that_cannot_check_itself_fails_the_contract():
    """The core's part of a tune mode's contract: it must bring its check (subclass the package's TuneMode)."""
    from ltbench import contract
    from ltbench.config import EmptyConfig

    class Stray:
        Config = EmptyConfig

        def apply(self, backbone, num_classes):
            return {}

    with pytest.raises(contract.ContractError, match="must subclass the TuneMode of the backbones it tunes"):
        contract.check_tune_mode(Stray, "stray")
