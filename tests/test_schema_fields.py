"""Schema 3: every key a reader takes from a result is one the schema requires of that record (issue 48).

The readers are run for real (``ltbench table`` and ``ltbench status`` on migrated copies of committed reference
results, with stage-2 results, and on the golden demo, which holds a failed run), on records that note every key
read from them: the top level, ``numerics`` (also as the tables carry them on, ``identity.numerics_of``) and
``metrics``. Each key must be one ``schema.FIELDS`` requires of
that record (by status and kind), a numerics field
``schema.numerics_required`` names for its device, or a metrics field the schema checks. A reader that
starts to read a key the schema does not require (and so would have to guess from its absence) fails here.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from ltbench import cli
from ltbench.results import identity, migrate, schema, store

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "reference-results"
#: The metrics keys schema.metrics_problem checks: required, or optional sections it declares.
METRICS_KEYS = {*schema.HEADLINE_METRICS, "per_class", "groups", "macro", "heads", "target_priors", "test_sets", "val"}


class Noted(dict):
    """A checked record that notes each key read from it (and from its numerics and metrics)."""

    def __init__(self, data: dict, read: set, prefix: str = ""):
        nested = {"numerics", "metrics"} if not prefix else set()
        super().__init__({k: Noted(v, read, f"{k}.") if k in nested and isinstance(v, dict) else v
                          for k, v in data.items()})
        self.read, self.prefix = read, prefix

    def _note(self, key):
        self.read.add(self.prefix + str(key))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def _results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for name in ("fmnist_untuned", "quickstart"):
        shutil.copytree(REFERENCES / name, root / name)
    run = sorted((REFERENCES / "fmnist_schedule_r32").iterdir())[0]
    shutil.copytree(run, root / "fmnist_schedule_r32" / run.name, ignore=lambda d, names: sorted(
        n for n in names if Path(d).name == store.POSTHOC_DIR and n not in sorted(names)[:3]))
    shutil.copytree(ROOT / "tests" / "golden" / "results" / "demo", root / "demo")
    migrate.migrate_folder(root)
    return root


def test_every_key_a_reader_takes_from_a_result_is_one_the_schema_requires(tmp_path, monkeypatch):
    root = _results(tmp_path)
    noted: list[Noted] = []
    check_result = store.check_result

    def noting(run_dir):
        check = check_result(run_dir)
        if check.result is None:
            return check
        noted.append(Noted(check.result, set()))
        return store.ResultCheck(check.state, noted[-1], check.reason)

    def numerics_of(result):  # the numerics a table carries on: each key read from them is noted too
        return Noted(numerics_of_result(result), result.read, "numerics.")

    numerics_of_result = identity.numerics_of
    monkeypatch.setattr(store, "check_result", noting)
    monkeypatch.setattr(identity, "numerics_of", numerics_of)
    for folder in sorted(p for p in root.iterdir()):
        for argv in (["table", str(folder), "--no-cache"], ["status", str(folder)]):
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli.main(argv) == 0, argv
    read = [(dict(rec), set(rec.read)) for rec in noted]  # plain copies: the checks below read nothing through them
    statuses = {(rec["status"], rec["kind"]) for rec, _ in read}
    assert statuses == {("done", None), ("done", "posthoc"), ("failed", None)}, statuses  # every kind was read

    strays = set()
    for rec, keys in read:
        allowed = set(schema.required_fields(rec))
        allowed |= {f"numerics.{f}" for f in schema.numerics_required((rec.get("numerics") or {}).get("device"))}
        allowed |= {f"metrics.{k}" for k in METRICS_KEYS}
        strays |= {(rec["status"], rec["kind"], key) for key in keys - allowed}
    assert not strays, f"keys read that schema.FIELDS does not require of the record: {sorted(strays, key=str)}"
    assert any("device_seconds" in keys for _, keys in read) and any("numerics.cpu_id" in keys for _, keys in read)
