"""The one grammar of a test-prior name: ``uniform``, ``forward<rho>`` or ``backward<rho>``. No torch.

Recipes (``eval.target_priors``, the SADE ``eval.test_sets``), table columns (``forward50``,
``prior:backward10``), published numbers (the claims in ``ltbench/claims/``), shifted-test metrics and the
shift figure all read a name with :func:`parse_prior`, so a name is accepted, refused and ordered
alike everywhere. ``rho`` is written in plain decimal digits (``50``, ``2.5``) between 1 and 1e6: no
exponent (``1e2``), no sign, no space, no underscore, because the name is also the key of the metric
in every result and the header of a column, and two spellings of one prior would be two columns.
"""

from __future__ import annotations

import math
import re

RHO_MAX = 1e6
DIRECTIONS = ("forward", "backward")
_NAME = re.compile(r"(forward|backward)([0-9]+(?:\.[0-9]+)?)")
HINT = "use uniform, forward<rho> or backward<rho> with rho in plain digits, 1 <= rho <= 1e6, e.g. forward50"


def parse_prior(name: object) -> tuple[str, float]:
    """'forward50' -> ('forward', 50.0); 'uniform' -> ('uniform', 1.0). ValueError for anything else."""
    if name == "uniform":
        return "uniform", 1.0
    m = _NAME.fullmatch(name) if isinstance(name, str) else None
    if m is not None:
        rho = float(m.group(2))
        if math.isfinite(rho) and 1 <= rho <= RHO_MAX:
            return m.group(1), rho
    shown = repr(name)[:60]
    raise ValueError(f"unknown target prior {shown}; {HINT}")


def is_prior_name(name: object) -> bool:
    try:
        parse_prior(name)
    except ValueError:
        return False
    return True


def prior_order(name: str) -> tuple:
    """Sort key: forward50 < forward10 < ... < forward2 < uniform < backward2 < ... < backward50 (from a
    test prior like the training profile to the reversed one); names outside the grammar sort last."""
    try:
        direction, rho = parse_prior(name)
    except ValueError:
        return (3, 0.0, str(name))
    if direction == "uniform":
        return (1, 0.0, "")
    return (0, -rho, "") if direction == "forward" else (2, rho, "")


def prior_position(name: str) -> float:
    """A signed position on a log axis: -log(rho) forward, 0 uniform, +log(rho) backward (the shift figure)."""
    direction, rho = parse_prior(name)
    return {"forward": -1.0, "uniform": 0.0, "backward": 1.0}[direction] * (math.log(rho) if rho > 1 else 0.0)
