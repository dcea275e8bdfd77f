"""Complete the code record of committed reference results from git history (docs/results-schema.md).

Results made before ltbench hashed every module a run executes recorded only their plugins' file hashes (or
nothing), so ``status`` and tables read their code as unknown. A result that names the commit it ran at, from
a clean working tree, can be completed without retraining: the modules it executed are read from that commit
(``ltbench.results.code.executed_modules``, the same function a worker uses, over ``git cat-file``), and their
normalised hashes recorded. Every plugin file hash the run did record is checked first: when the commit's file
differs (a module imported before a later edit), the file with those exact bytes is looked up in the path's
history and used instead; when none has them, that module stays unchecked. A result whose working tree was
dirty is not completed: which code ran is unknown, and its ``code_source`` says so.

    python scripts/code_from_git.py docs/reference-results          # rewrite the records in place
    python scripts/code_from_git.py docs/reference-results --check  # exit 1 if one is left to complete

The record keeps what the run wrote as ``code_as_recorded``; ``code_source`` says how ``code`` was made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ltbench.results import code  # noqa: E402  (the repository's own package, not an installed one)
from ltbench.results.identity import relative_code_path  # noqa: E402
from ltbench.results.provenance import names_in  # noqa: E402


class Git:
    """Blobs of ``commit:path`` through one ``git cat-file --batch`` process; file histories through ``git log``."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.cache: dict = {}

    def blob(self, commit: str, path: str) -> bytes | None:
        key = f"{commit}:{path}"
        if key not in self.cache:
            self.proc.stdin.write(key.encode() + b"\n")
            self.proc.stdin.flush()
            header = self.proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                self.cache[key] = None
            else:
                data = self.proc.stdout.read(int(header[2]))
                self.proc.stdout.read(1)
                self.cache[key] = data
        return self.cache[key]

    def versions(self, path: str) -> list[str]:
        key = f"log\0{path}"
        if key not in self.cache:
            out = subprocess.run(["git", "log", "--all", "--format=%H", "--", path], cwd=self.repo,
                                 capture_output=True, text=True)
            self.cache[key] = out.stdout.split()
        return self.cache[key]

    def defining(self, commit: str, pattern: str, folders: tuple[str, ...]) -> list[str]:
        """Files at ``commit`` (in ``folders``) whose text matches the fixed string ``pattern`` (cached: the
        stage-2 results of one run ask the same questions hundreds of times)."""
        key = f"{commit}\0{pattern}\0{folders}"
        if key not in self.cache:
            out = subprocess.run(["git", "grep", "-l", "-F", pattern, commit, "--", *folders], cwd=self.repo,
                                 capture_output=True, text=True)
            self.cache[key] = [line.split(":", 1)[1] for line in out.stdout.splitlines() if line.endswith(".py")]
        return self.cache[key]


def _module_of(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def roots_at(git: Git, commit: str, result: dict) -> list[str]:
    """The modules a result's computation started from at its commit: the engine (and the stage-2 driver for
    a stage-2 result), the modules its recorded code names, and those registering its plugins' names."""
    driver = ["def posthoc_one_run"] if result.get("kind") == "posthoc" else []
    roots = []
    for marker in ["def final_outcome", "def train(spec"] + driver:
        roots += [_module_of(p) for p in git.defining(commit, marker, ("ltbench",))][:1]
    recorded = result.get("code") if isinstance(result.get("code"), dict) else {}
    roots += sorted(recorded)
    config = result.get("config") or {}
    names = names_in(config.get("method")) + names_in(config.get("posthoc"))
    names += [config.get("data", {}).get("name"), config.get("backbone", {}).get("name")]
    names += [(config.get("sampler") or {}).get("name")]
    for name in filter(None, names):
        roots += [_module_of(p) for p in git.defining(commit, f'.register("{name}")', ("ltbench", "methods"))]
    return sorted(set(roots))


def recorded_bytes(git: Git, commit: str, result: dict) -> tuple[dict[str, bytes | None], list[str]]:
    """{relative path: the bytes the run recorded a hash of, or None when no version of the file has them}
    for every plugin module the run recorded, and what was noticed on the way."""
    out, notes = {}, []
    for module, entry in sorted((result.get("code") or {}).items()):
        if not isinstance(entry, dict) or not entry.get("sha256"):
            continue
        rel = relative_code_path(module, str(entry.get("path") or code.module_path(module)))
        data = git.blob(commit, rel)
        if data is not None and hashlib.sha256(data).hexdigest() == entry["sha256"]:
            continue
        found = None
        for version in git.versions(rel):
            candidate = git.blob(version, rel)
            if candidate is not None and hashlib.sha256(candidate).hexdigest() == entry["sha256"]:
                found = candidate
                notes.append(f"{rel} as recorded (its bytes are those of {version[:12]}, not of the run's commit)")
                break
        if found is None:
            notes.append(f"{rel}: no version in the history has the recorded bytes: not checked")
        out[rel] = found
    return out, notes


def completed_code(git: Git, result: dict) -> tuple[dict, str] | None:
    """(code record, code_source) for a result, or None when it cannot be completed (no commit, dirty tree)."""
    prov = result.get("provenance") or {}
    commit = prov.get("git_commit")
    if not commit or git.blob(commit, "ltbench/__init__.py") is None:
        return None
    if prov.get("git_dirty"):
        return None
    exact, notes = recorded_bytes(git, commit, result)
    unchecked = {rel for rel, data in exact.items() if data is None}

    def read(rel: str) -> bytes | None:
        return exact[rel] if exact.get(rel) is not None else git.blob(commit, rel)

    roots = roots_at(git, commit, result)
    packages = {r.split(".")[0] for r in roots} | {"ltbench"}
    record = code.code_record(code.executed_modules(roots, read, packages), with_bytes=result.get("kind") != "posthoc")
    for name, entry in record.items():
        if entry.get("path", code.module_path(name)) in unchecked:
            entry["normalized"] = None  # the bytes that ran are unknown: code_state reads it as unchecked
    recorded = "only its plugins'" if result.get("code") else "no"
    source = (f"completed from git commit {commit[:12]} by scripts/code_from_git.py: the run recorded "
              f"{recorded} code; the modules it executed were read "
              f"from that commit (clean working tree)") + (f"; {'; '.join(notes)}" if notes else "")
    return record, source


def dirty_source(result: dict) -> str | None:
    prov = result.get("provenance") or {}
    if prov.get("git_commit") and prov.get("git_dirty"):
        return (f"not completed from git: the working tree of commit {prov['git_commit'][:12]} had uncommitted "
                f"changes when the run was made, so which code ran is unknown")
    return None


def write_like(path: Path, text: str, obj: dict) -> None:
    """Rewrite a record in the layout it had: ltbench's (indent 2, sorted keys) or the compact one."""
    compact = "\n" not in text.rstrip("\n")
    out = json.dumps(obj, sort_keys=True, separators=(",", ":")) if compact else \
        json.dumps(obj, indent=2, sort_keys=True) + "\n"
    path.write_text(out)


def complete(path: Path, git: Git, check: bool) -> str:
    """'done' (already complete), 'completed', 'dirty' or 'no commit' for one result.json."""
    text = path.read_text()
    result = json.loads(text)
    if result.get("code_scope") == code.CODE_SCOPE or result.get("status") != "done":
        return "done"
    if dirty_source(result):
        if not check and result.get("code_source") != dirty_source(result):
            write_like(path, text, {**result, "code_source": dirty_source(result)})
        return "dirty"
    made = completed_code(git, result)
    if made is None:
        return "no commit"
    if check:
        return "to complete"
    record, source = made
    new = {**result, "code": record, "code_scope": code.CODE_SCOPE, "code_source": source}
    if result.get("code"):
        new["code_as_recorded"] = result["code"]
    write_like(path, text, new)
    return "completed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a record can be completed")
    args = parser.parse_args()
    git = Git(ROOT)
    counts: dict[str, int] = {}
    for path in sorted(args.folder.rglob("result.json")):
        state = complete(path, git, args.check)
        counts[state] = counts.get(state, 0) + 1
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 1 if args.check and counts.get("to complete") else 0


if __name__ == "__main__":
    sys.exit(main())
