"""The record history lives in one migration (ltbench/results/migrate.py), never in a reader.

tests/golden/schema1/ holds records exactly as ltbench wrote them before schema 2 (copied from the
reference results before their migration: a quickstart folder, a batched run of augmentation scheme 1,
SADE before expert_width, BAPE with a nested LA spec, a run with stage-2 results), and the tables the
previous ltbench printed of them (``*.table.md``, made by that code). Migrating a copy must keep every
number of those tables, give every record the id of its configuration, and change nothing the second time.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ltbench import cli
from ltbench.results import identity, migrate, schema, status_rule, store

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "schema1"
def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(GOLDEN, root, ignore=shutil.ignore_patterns("*.table.md"))
    return root


def _numbers(table_text: str) -> list[tuple[str, ...]]:
    """The numeric cells of each row of a markdown table, markup removed, rows in sorted order."""
    rows = []
    for line in table_text.splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            cells = [re.sub(r"\*\*|</?u>", "", c).strip() for c in line.strip("|").split("|")[1:]]
            rows.append(tuple(cells))
    return sorted(rows)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_migrating_keeps_every_number_and_names_each_record_by_its_configuration(tmp_path):
    root = _copy(tmp_path)
    before = {p.relative_to(root): json.loads(p.read_text()) for p in root.rglob(store.RESULT)}
    assert all(schema.is_older(r) for r in before.values())

    migrate.migrate_folder(root)

    after = {p.relative_to(root): json.loads(p.read_text()) for p in root.rglob(store.RESULT)}
    assert len(after) == len(before) == 18
    old_by_id = {r["run_id"]: r for r in before.values()}
    for path, rec in after.items():
        assert rec["schema_version"] == schema.SCHEMA_VERSION and schema.result_problem(rec) == "", path
        assert rec["run_id"] == identity.config_id(rec["config"])
        if rec.get("kind") != "posthoc":
            assert path.parent.name == rec["run_id"]
        old = old_by_id[rec["migrated_from"]]
        for evidence in ("metrics", "method_extras", "selection", "started", "ended", "seed", "code_source"):
            assert rec.get(evidence) == old.get(evidence), (path, evidence)  # the evidence is never changed
        for module, entry in old.get("code", {}).items():
            new = rec["code"][migrate.MOVED_MODULES.get(module, module)]
            assert (new.get("normalized"), new.get("sha256")) == (entry.get("normalized"), entry.get("sha256"))
        assert not any(str(v).startswith("/") for v in rec["provenance"].get("argv", []))
        assert rec["config"]["sampler"]["name"] == old["config"].get("sampler", {}).get("name", "uniform")
    sade = next(r for r in after.values() if r["config"]["method"]["name"] == "sade")
    assert sade["config"]["method"]["expert_width"] == 1.0  # what it ran, not today's default 0.75
    batch = next(r for r in after.values() if r["config"]["train"]["augment_on"] == "batch")
    assert batch["config"]["train"]["augment_scheme"] == 1
    bape = next(r for r in after.values() if r["config"]["method"]["name"] == "bape" and "posthoc" not in r)
    assert bape["config"]["method"]["aux"]["loss_views"] == "first"
    for name in ("quickstart", "mixed"):
        expected = (GOLDEN / f"{name}.table.md").read_text()
        shown = subprocess.run([sys.executable, "-m", "ltbench", "table", str(root / name)], capture_output=True,
                               text=True, check=True).stdout
        assert _numbers(shown) == _numbers(expected) and _numbers(shown)


def test_migrating_twice_changes_nothing_and_an_interrupted_migration_resumes(tmp_path, monkeypatch):
    root = _copy(tmp_path)
    real_rename = migrate.os.rename
    calls = []

    def crash_on_third(src, dst):
        calls.append(src)
        if len(calls) == 3:
            raise KeyboardInterrupt  # killed between writing a folder's records and renaming it
        real_rename(src, dst)

    monkeypatch.setattr(migrate.os, "rename", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        migrate.migrate_folder(root)
    monkeypatch.setattr(migrate.os, "rename", real_rename)
    migrate.migrate_folder(root)
    once = _files(root)
    report = migrate.migrate_folder(root)
    assert _files(root) == once and report.migrated == 0 and not report.renamed
    for path in root.rglob(store.RESULT):
        rec = json.loads(path.read_text())
        assert rec.get("kind") == "posthoc" or path.parent.name == rec["run_id"]


def test_a_folder_whose_new_id_is_taken_is_left_as_it_is(tmp_path):
    root = _copy(tmp_path)
    folder = next(p.parent for p in (root / "quickstart").glob(f"*/{store.RESULT}"))
    new_id = identity.run_id(migrate.migrate_record(json.loads((folder / store.RESULT).read_text()))["config"])
    (folder.parent / new_id).mkdir()
    (folder.parent / new_id / "mine.txt").write_text("someone's file")
    report = migrate.migrate_folder(root)
    assert any(folder.name in line and "is taken" in line for line in report.left)
    assert schema.is_older(json.loads((folder / store.RESULT).read_text()))  # untouched, nothing lost
    assert (folder.parent / new_id / "mine.txt").read_text() == "someone's file"


def test_dry_run_changes_nothing(tmp_path, capsys):
    root = _copy(tmp_path)
    before = _files(root)
    assert cli.main(["migrate", str(root), "--dry-run"]) == 0
    assert "would migrate 18 record(s)" in capsys.readouterr().out
    assert _files(root) == before


def test_an_older_record_is_named_in_one_line_by_every_command(tmp_path, write_recipe, capsys):
    root = _copy(tmp_path) / "quickstart"
    hint = f"'ltbench migrate {root}' brings them up to date"
    assert cli.main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count(hint) == 13 and "12 older" in out  # each folder's line, then one summary line
    assert cli.main(["table", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count(hint) == 1 and "12 run folder(s) left out" in out
    # a command that would write beside them stops before anything runs
    path = write_recipe("quickstart", {"results_dir": str(root.parent)})
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "12 run folder(s) hold records of an older ltbench" in err
    assert f"'ltbench migrate {root}'" in err


def test_a_selector_naming_an_option_at_its_default_matches_the_runs_that_used_it(write_recipe):
    """``where: {method.loss_views: first}`` matches an LA run that left loss_views out of its recipe (the
    resolved configuration holds every default), and the sampler's default is matched the same way."""
    from ltbench import report
    from reportkit import write_run

    tables = {"t": {"rows": [
        {"label": "LA first", "where": {"method.name": "la", "method.loss_views": "first", "sampler.name": "uniform"}},
        {"label": "LA all", "where": {"method.name": "la", "method.loss_views": "all"}}]}}
    path = write_recipe("sel", {"method": {"name": "la"}, "tables": tables})
    from ltbench.recipe import load_recipe

    recipe = load_recipe(path)
    write_run(recipe.runs[0])
    (table,) = report.tables(path, use_cache=False)
    first, other = table.rows
    assert first.units and all(u.runs for u in first.units.values())
    assert not any(u.runs for u in other.units.values())


# ------------------------------------------------------------------------------------------------
# Only ltbench's own records (issue 48): foreign folders, newer schemas and damaged records


def _golden_run(root: Path) -> Path:
    """One run folder of the golden quickstart results (schema 1) under ``root``."""
    folder = next(p.parent for p in sorted((GOLDEN / "quickstart").glob(f"*/{store.RESULT}")))
    shutil.copytree(folder, root / "quickstart" / folder.name)
    return root / "quickstart" / folder.name


def _all_current_but(root: Path, *left: Path) -> bool:
    """Every record below ``root`` is in the current format, but those in the folders ``left``."""
    versions = {p: json.loads(p.read_text()).get("schema_version") for name in (store.RESULT, store.SPEC)
                for p in root.rglob(name) if not any(f in p.parents for f in left)}
    return bool(versions) and set(versions.values()) == {schema.SCHEMA_VERSION}


def _edit(path: Path, **changes) -> None:
    rec = json.loads(path.read_text())
    rec.update(changes)
    path.write_text(json.dumps(rec))


def test_numbered_steps_bring_each_version_only_what_it_lacks():
    assert max(step.to for step in migrate.STEPS) == schema.SCHEMA_VERSION
    rec = json.loads(next((GOLDEN / "quickstart").glob(f"*/{store.RESULT}")).read_text())
    from_two = migrate.migrate_record(rec, 2)  # as if it were schema 2: the step to 3 only
    assert from_two["config"] == rec["config"] and from_two["unrecorded"]
    assert migrate.migrate_record(rec, 1)["config"] != rec["config"]  # schema 1 gets the explicit defaults too


def test_a_folder_holding_no_ltbench_record_is_never_touched(tmp_path, capsys):
    root = tmp_path / "results"
    run = _golden_run(root)
    project = root / "my_project"
    project.mkdir()
    (project / store.SPEC).write_text(json.dumps({"config": {"data": {"name": "d"}, "backbone": {"name": "b"},
                                                            "method": {"name": "m"}}, "lr": 0.1}))
    (project / store.RESULT).write_text('{"status": "done", "run_id": "mine"}')
    before = _files(project)
    assert cli.main(["migrate", str(root)]) == 0
    out = capsys.readouterr().out
    assert _files(project) == before and "not touched: 1 folder(s)" in out and "my_project" not in out
    assert not run.exists()  # the ltbench run beside it was migrated (and renamed to its new id)
    assert store.older_records(root) == []  # and `ltbench run` does not take the project for an older record


def test_a_record_of_a_newer_or_unknown_schema_is_named_and_left_with_its_folder(tmp_path):
    root = _copy(tmp_path)
    first, second = sorted(p.parent for p in (root / "quickstart").glob(f"*/{store.RESULT}"))[:2]
    _edit(first / store.RESULT, schema_version=schema.SCHEMA_VERSION + 1)
    _edit(second / store.RESULT, schema_version="x")
    before = {f: _files(f) for f in (first, second)}
    report = migrate.migrate_folder(root)
    assert {f: _files(f) for f in (first, second)} == before  # untouched, and not renamed
    assert any(first.name in line and "made by a newer ltbench" in line for line in report.left)
    assert any(second.name in line and "schema_version 'x', which this ltbench" in line for line in report.left)
    assert report.migrated and _all_current_but(root, first, second)  # every other record was migrated


def test_a_damaged_record_is_named_the_rest_migrated_and_run_reads_it_as_damaged(tmp_path, capsys):
    root = _copy(tmp_path)
    damaged, unreadable = sorted(p.parent for p in (root / "quickstart").glob(f"*/{store.RESULT}"))[:2]
    for folder in (damaged,):
        for name in (store.RESULT, store.SPEC):
            if (folder / name).exists():
                rec = json.loads((folder / name).read_text())
                rec["config"]["data"] = "not a section"
                (folder / name).write_text(json.dumps(rec))
    (unreadable / store.RESULT).write_text('{"status": "done", "run_id": "' + unreadable.name + '", ')  # truncated
    assert cli.main(["migrate", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{damaged.relative_to(root)}: result.json is damaged (config (data, backbone, method names) is missing)" \
        in out
    assert f"{unreadable.relative_to(root)}: result.json is not valid JSON" in out
    assert _all_current_but(root, damaged, unreadable)  # everything else was migrated
    # every command reads the damaged record as damaged (run it again), never as 'older' (which no migration ends)
    assert store.check_result(damaged).state == "unusable" and status_rule.run_status(damaged) == "damaged"
    assert damaged not in store.older_records(damaged.parent)


def test_the_dry_run_lists_exactly_what_the_real_run_does(tmp_path, capsys):
    root = _copy(tmp_path)
    folders = sorted(p.parent for p in (root / "quickstart").glob(f"*/{store.RESULT}"))
    _edit(folders[0] / store.RESULT, schema_version=schema.SCHEMA_VERSION + 1)
    (folders[1] / store.RESULT).write_text("{")
    twin = folders[2].parent / "twin"  # a copy of a run under another name: both want one new id
    shutil.copytree(folders[2], twin)
    _edit(twin / store.RESULT, run_id="twin")
    _edit(folders[3] / store.RESULT, method_extras={"x": float("nan")})  # a value no JSON write takes
    for stage2 in sorted(root.rglob(f"{store.POSTHOC_DIR}/*/{store.RESULT}"))[:1]:
        stage2.write_text("[]")
    before = _files(root)
    assert cli.main(["migrate", str(root), "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert _files(root) == before
    assert cli.main(["migrate", str(root)]) == 0
    done = capsys.readouterr().out
    assert planned.replace("would migrate", "migrated").replace("would rename", "renamed") == done
    assert "is taken by another folder" in done and "is not a JSON object" in done and "holds a NaN" in done


def test_names_read_from_the_disk_are_printed_without_control_characters(tmp_path, capsys):
    root = tmp_path / "results"
    run = _golden_run(root)
    odd = run.parent / "run\x1b[2J\x07"
    shutil.copytree(run, odd)
    _edit(odd / store.RESULT, run_id=odd.name, schema_version=99)
    assert cli.main(["migrate", str(root)]) == 0
    out = capsys.readouterr().out
    assert "made by a newer ltbench" in out and not any(c in out for c in "\x1b\x07")
