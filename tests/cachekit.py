"""Forging a cache file as someone without this user's key would (ltbench/results/caches.py): read its content,
change it, and seal it again, under another key (``FORGER_KEY``) or with the seal of ltbench before the key
(sha256 of the code version and the bytes: anyone could compute it). ``sealed_as_owner`` seals with the real key,
the control that shows a test could fail: what the owner seals is trusted."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from ltbench.results import caches

FORGER_KEY = b"k" * caches.KEY_BYTES


def content(path: Path) -> bytes:
    """The bytes a cache file seals, its seal unchecked."""
    return Path(path).read_bytes().partition(b"\n")[2]


def forged(data: bytes, inputs=None, scheme: str = "wrong key") -> bytes:
    """``data`` sealed by a forger: under FORGER_KEY (with the real code version and ``inputs``: neither is
    secret), or with the pre-key seal ("old scheme")."""
    if scheme == "old scheme":
        digest = hashlib.sha256(caches.code_version().encode() + b"\n" + data).hexdigest()
    else:
        message = json.dumps([caches.code_version(), inputs], default=repr).encode() + b"\0" + data
        digest = hmac.new(FORGER_KEY, message, hashlib.sha256).hexdigest()
    return caches.SEAL + digest.encode() + b"\n" + data


def sealed_as_owner(data: bytes, inputs) -> bytes:
    return caches.sealed(data, inputs)


def read_json_cache(path: Path):
    return json.loads(content(path))


def write_json_cache(path: Path, data, inputs=None, scheme: str = "wrong key") -> None:
    Path(path).write_bytes(forged(json.dumps(data).encode(), inputs, scheme))


def edit_json_cache(path: Path, change, inputs=None, scheme: str = "wrong key") -> None:
    data = read_json_cache(path)
    change(data)
    write_json_cache(path, data, inputs, scheme)


def index_parts(path: Path) -> tuple[dict, bytes]:
    """(the JSON part, the float64 matrix bytes) of an index cache (ltbench/report/index.py)."""
    blob = content(path)
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_index(path: Path, meta, values: bytes, inputs=None) -> None:
    text = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    Path(path).write_bytes(forged(len(text).to_bytes(8, "little") + text + values, inputs))


def edit_keeping_seal(path: Path, change) -> None:
    """Edit a JSON cache in place and keep its old seal line (what a hand edit or a careless tool does)."""
    blob = Path(path).read_bytes()
    seal, _, body = blob.partition(b"\n")
    data = json.loads(body)
    change(data)
    Path(path).write_bytes(seal + b"\n" + json.dumps(data).encode())


def runs_edit(change):
    """An edit of an expansion cache's run specs (kept there as JSON text, ltbench/report/expected.py):
    ``change(the list of specs)``."""
    def edit(d):
        runs = json.loads(d["runs"])
        change(runs)
        d["runs"] = json.dumps(runs)
    return edit
