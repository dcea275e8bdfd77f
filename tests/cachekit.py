"""Editing a cache file as a forger who recomputes its seal would (ltbench/results/caches.py): so that the tests
of each entry check exercise those checks, not only the seal. ``edit_json_cache(path, change)`` and
``edit_index(path, change)`` rewrite the content and seal it again under the running code."""

from __future__ import annotations

import json
from pathlib import Path

from ltbench.results import caches


def read_json_cache(path: Path):
    return json.loads(caches.unsealed(Path(path).read_bytes()))


def write_json_cache(path: Path, data) -> None:
    Path(path).write_bytes(caches.sealed(json.dumps(data).encode()))


def edit_json_cache(path: Path, change) -> None:
    data = read_json_cache(path)
    change(data)
    write_json_cache(path, data)


def index_parts(path: Path) -> tuple[dict, bytes]:
    """(the JSON part, the float64 matrix bytes) of an index cache (ltbench/report/index.py)."""
    from ltbench.report import index

    blob = caches.unsealed(Path(path).read_bytes())
    start = len(index.CACHE_MAGIC) + 8
    n = int.from_bytes(blob[len(index.CACHE_MAGIC):start], "little")
    return json.loads(blob[start:start + n]), blob[start + n:]


def write_index(path: Path, meta, values: bytes) -> None:
    from ltbench.report import index

    text = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    Path(path).write_bytes(caches.sealed(index.CACHE_MAGIC + len(text).to_bytes(8, "little") + text + values))


def edit_keeping_seal(path: Path, change) -> None:
    """Edit a JSON cache in place and keep its old seal line (what a hand edit or a careless tool does)."""
    blob = Path(path).read_bytes()
    seal, _, body = blob.partition(b"\n")
    data = json.loads(body)
    change(data)
    Path(path).write_bytes(seal + b"\n" + json.dumps(data).encode())
