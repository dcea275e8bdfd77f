"""Seeds derived from named parts, so every random choice of a run is a pure function of what it is for.

Kept in its own module (no torch, no numpy) because the engine, the samplers and the data splits all
derive seeds the same way, and none of them may import the others.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A 31-bit seed from any parts (the first 4 bytes of their sha1: called once per sample)."""
    return int.from_bytes(hashlib.sha1(repr(parts).encode()).digest()[:4], "big") % (2**31)
