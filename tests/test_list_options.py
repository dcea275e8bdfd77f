"""`ltbench list KIND --options`: every option of every plugin with its type, default and one line of doc,
read from the Config dataclass (so the listing cannot drift from what a recipe may set)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from ltbench import cli, registry
from ltbench.config import describe_options
from tests.conftest import registries_restored


@pytest.mark.parametrize("kind", sorted(registry.REGISTRIES))
def test_every_built_in_option_is_listed_with_a_doc(kind, capsys):
    """A contract over everything registered: an option without a doc is a listing that tells nothing."""
    entries = registry.REGISTRIES[kind].entries()
    for entry in entries:
        for option in describe_options(getattr(entry.obj, "Config", None) or object):
            assert option.doc, f"{kind} {entry.name}: option '{option.name}' has no doc (a comment on its line)"
    assert cli.main(["list", kind, "--options"]) == 0
    out = capsys.readouterr().out
    for entry in entries:
        for option in describe_options(getattr(entry.obj, "Config", None) or object):
            assert re.search(rf"^ +{option.name} +{re.escape(option.type)} +{re.escape(option.default)} +"
                             rf"{re.escape(option.doc)}$", out, re.M), (entry.name, option)


def test_la_options_as_a_user_reads_them(capsys):
    assert cli.main(["list", "methods", "la", "--options"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("la  Logit-adjusted loss") and lines[1].startswith("    from ")
    assert re.match(r"^ {6}tau +float +1\.0 +temperature of the prior adjustment$", lines[2]), lines[2]
    assert any(re.match(r"^ {6}head +linear\|cosine +linear +cosine: ", line) for line in lines)


def test_the_listing_shows_the_default_a_recipe_gets(capsys):
    """SADE's expert_width: a recipe leaving it out gets the official 0.75 (the results recorded before the
    option existed ran 1.0, and say so in their configuration since their migration)."""
    assert cli.main(["list", "methods", "sade", "--options"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("expert_width"))
    assert re.match(r"^ +expert_width +float +0\.75 +Channels", line), line


@dataclass
class Base:
    lr: float = 0.1  # step size
    steps: int = 10
    """How many steps. More text that is not listed."""
    # The kind of schedule,
    # continued on a second comment line.
    schedule: str = "cosine"
    names: list[str] = field(default_factory=lambda: ["a", "b"], metadata={"doc": "given in the field itself"})
    required: int = field(default=0)


@dataclass
class Child(Base):
    lr: float = 0.5  # no doc of its own would keep the base's; this one replaces it
    steps: int = 20


def test_docs_from_comments_docstrings_metadata_and_base_classes():
    options = {o.name: o for o in describe_options(Child)}
    assert options["lr"].default == "0.5" and options["lr"].doc.startswith("no doc of its own")
    assert options["steps"].doc == "How many steps." and options["steps"].default == "20"  # inherited doc
    assert options["schedule"].doc == "The kind of schedule, continued on a second comment line."
    assert options["names"].doc == "given in the field itself" and options["names"].default == "[a, b]"
    assert options["names"].type == "list[str]" and options["required"].doc == ""
    assert describe_options(int) == []


def test_a_plugin_folder_s_options_and_an_unknown_name(tmp_path, capsys):
    (tmp_path / "myplug").mkdir()
    (tmp_path / "myplug" / "focal.py").write_text(
        "from dataclasses import dataclass\n"
        "from ltbench.method import Method\nfrom ltbench.registry import METHODS\n\n\n"
        "@dataclass\nclass FocalConfig:\n    gamma: float = 2.0  # focusing exponent\n\n\n"
        "@METHODS.register('my_focal')\nclass Focal(Method):\n    \"\"\"Focal loss.\"\"\"\n    Config = FocalConfig\n")
    with registries_restored():
        assert cli.main(["list", "methods", "my_focal", "--options", "--plugins", str(tmp_path / "myplug")]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^ +gamma +float +2\.0 +focusing exponent$", out, re.M), out
        assert cli.main(["list", "methods", "my_focl", "--plugins", str(tmp_path / "myplug")]) == 2
        assert "Did you mean 'my_focal'?" in capsys.readouterr().err
