"""``ltbench plan``: before a launch, what the declared seeds can detect, and how many seeds a difference needs.

For every comparison a recipe's tables make (``versus``, else each row against the best of its column), from
the spread of a pilot's finished runs or a declared ``--spread``: the smallest difference Welch's test over
seeds finds with 80 % power at two-sided alpha = 0.05, and the seeds per row that detect ``--detect`` points.
Power is Welch's test's own (``power``), not the normal or noncentral-t approximations, both optimistic at a
few seeds (tests/test_claims.py simulates it). Each comparison is one test: a Holm family needs more. No torch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ltbench import report
from ltbench.report.significance import ALPHA, POWER

QUANTILES = 64  # per sample variance in ``power``: within 0.3 points of a 40,000-draw simulation (tests/test_claims.py)


def power(diff: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = ALPHA) -> float:
    """The chance that Welch's test (two-sided ``alpha``) finds a true difference ``diff`` between two rows of
    ``n_a`` and ``n_b`` seeds with these seed-to-seed standard deviations. Exact up to quadrature: given the
    two sample variances (a grid of 64 quantiles of each one's scaled chi-square), the difference of means is
    normal and Welch's critical value and degrees of freedom are fixed; the power is the mean over the grid.
    The noncentral t with the Welch-Satterthwaite degrees of freedom at the true spreads ignores that the
    test estimates them, and overstated the power by up to 9 points at 3 seeds (docs/significance.md)."""
    from scipy.stats import chi2, norm, t

    q = (np.arange(QUANTILES) + 0.5) / QUANTILES
    va = sd_a ** 2 / n_a * chi2.ppf(q, n_a - 1)[:, None] / (n_a - 1)
    vb = sd_b ** 2 / n_b * chi2.ppf(q, n_b - 1)[None, :] / (n_b - 1)
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    critical = t.ppf(1 - alpha / 2, df) * np.sqrt(va + vb)
    spread = math.sqrt(sd_a ** 2 / n_a + sd_b ** 2 / n_b)
    return float(np.mean(norm.cdf((abs(diff) - critical) / spread) + norm.cdf((-abs(diff) - critical) / spread)))


def detectable(sd_a: float, sd_b: float, n: int, target: float = POWER) -> float:
    """The smallest difference detected with probability ``target`` at ``n`` seeds per row."""
    from scipy.optimize import brentq

    high = 60 * math.hypot(sd_a, sd_b) / math.sqrt(n)  # 60 standard errors: found for certain at n >= 2
    return float(brentq(lambda d: power(d, sd_a, sd_b, n, n) - target, 1e-9, high, xtol=1e-6))


def seeds_for(diff: float, sd_a: float, sd_b: float, target: float = POWER, most: int = 10_000) -> int | None:
    """The fewest seeds per row (>= 2) that detect ``diff`` with probability ``target``; None beyond ``most``."""
    low, high = 2, most
    if power(diff, sd_a, sd_b, high, high) < target:
        return None
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if power(diff, sd_a, sd_b, mid, mid) < target else (low, mid)
    return low


def comparisons(table) -> list[tuple[str, str, str, list[float], list[float]]]:
    """(column, row, reference row, row's values, reference's values) for each comparison a table makes."""
    out = []
    for gi in range(len(table.groups)):
        group = " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot)))
        for ci, (_, header) in enumerate(table.columns):
            where = f"{group}: {header}" if group else header
            if table.comparisons:
                pairs = [(c.row, c.reference) for c in table.comparisons]
            else:
                rows = [r for r in table.rows if not r.published and (gi, ci) in r.cells]
                filled = [r for r in rows if r.cells[(gi, ci)].values]
                best = max(filled, key=lambda r: r.cells[(gi, ci)].mean, default=None)
                pairs = [(r, best) for r in rows if best is not None and r is not best]
            for row, ref in pairs:
                a, b = row.cells.get((gi, ci)), ref.cells.get((gi, ci))
                out.append((where, row.label, ref.label, list(a.values) if a else [], list(b.values) if b else []))
    return out


def plan_lines(tables: list, seeds: int, spread: float | None = None, detect: float | None = None) -> list[str]:
    """One line per comparison: the spreads used, what ``seeds`` per row detect, the seeds ``detect`` needs."""
    lines = [f"power plan: Welch's test over seeds, alpha {ALPHA} two-sided, {POWER:.0%} power (Welch's own, "
             f"not the normal or noncentral-t approximation), "
             f"{seeds} seed(s) per row declared; spreads from finished runs (n >= 2), else "
             + (f"the declared {spread:g}" if spread is not None else "unknown (give --spread SD or run a pilot)")]
    if seeds < 2:
        return lines + ["  one seed per row: no spread to test with; declare 2 or more seeds"]
    for table in tables:
        for column, label, ref, a, b in comparisons(table):
            sds = [_sd(v) if len(v) >= 2 else spread for v in (a, b)]
            head = f"  {table.name}, {column}: {label} vs {ref}"
            if None in sds or not any(sds):
                why = "constant over seeds on both sides: no test" if None not in sds else "spread unknown"
                lines.append(f"{head}: {why} ({len(a)} and {len(b)} finished seed(s))")
                continue
            text = f"{head} (sd {sds[0]:.2f} / {sds[1]:.2f}): detects {detectable(*sds, seeds):.2f} points"
            if detect is not None:
                need = seeds_for(detect, *sds)
                text += f"; {detect:g} point(s) need {need if need else 'more than 10000'} seeds per row"
            lines.append(text)
    return lines


def _sd(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def command(args) -> int:
    """``ltbench plan RECIPE [--results DIR] [--spread SD] [--detect POINTS]``."""
    _, recipe, _ = report.source(args.recipe, args.results, True, args.overrides)
    tables = report.tables(args.recipe, args.results, overrides=args.overrides)
    print("\n".join(plan_lines(tables, len(recipe.seeds), args.spread, args.detect)))
    return 0


def dry_run_lines(recipe) -> list[str]:
    """``ltbench run --dry-run``: the plan's lines when finished runs of the recipe (the loaded one, its overrides
    and --where) give spreads, else none."""
    if not recipe.tables or not Path(recipe.root).is_dir():  # nothing finished: nothing to estimate spreads from
        return []
    built = report.tables(recipe.path, recipe.results_arg, overrides=list(recipe.overrides), where=recipe.where)
    lines = plan_lines(built, len({s.config["seed"] for s in recipe.runs}))
    return lines if any("detects" in line for line in lines) else []
