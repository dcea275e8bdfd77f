"""Command line of the claims: ``ltbench verify``, ``ltbench plan`` and ``ltbench data verify``.

Kept apart from cli.py so that file only wires them in; every import is lazy (``--help`` stays fast) and
none reaches torch (docs/claims.md, docs/significance.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_verify(args) -> int:
    from ltbench import report
    from ltbench.report import verify
    from ltbench.report.claims import load_claims

    records, _, root = report.source(args.path, args.results, True, args.overrides)
    if args.export:
        written = verify.export(records, Path(args.export), cite=f"ltbench runs in {root}")
        print(f"{len(written)} claim file(s) written to {args.export} (one per configuration of the finished runs)")
        return 0
    claims = load_claims(Path(args.claims) if args.claims else None)
    print(verify.render(verify.verify(claims, records, args.margin), args.format))
    return 0


def cmd_plan(args) -> int:
    from ltbench import report
    from ltbench.report.plan import plan_lines

    from ltbench.cli import load_checked_recipe  # the recipe checks of every command

    recipe = load_checked_recipe(args.recipe, args.overrides, args.results)
    tables = report.tables(args.recipe, args.results, overrides=args.overrides)
    seeds = len({spec.config["seed"] for spec in recipe.runs})
    print("\n".join(plan_lines(tables, seeds, args.spread, args.detect)))
    return 0


def power_lines(recipe_path: str, overrides: list[str], results: str | None) -> list[str]:
    """``ltbench run --dry-run``: the plan's lines when finished runs of the recipe give spreads, else none."""
    from ltbench import report
    from ltbench.report.plan import plan_lines
    from ltbench.recipe import load_recipe

    recipe = load_recipe(recipe_path, overrides, results)
    if not recipe.tables or not Path(recipe.root).is_dir():  # nothing finished: nothing to estimate spreads from
        return []
    lines = plan_lines(report.tables(recipe_path, results, overrides=overrides), len({s.config["seed"] for s in recipe.runs}))
    return lines if any("detects" in line for line in lines) else []


def data_verify(roots: list[str], dataset: str | None) -> int:
    """``ltbench data verify ROOT --dataset NAME``: the known variant of the files in ROOT, or 'unknown variant'."""
    from ltbench.data.protocol import verify_files
    from ltbench.errors import LtbenchError

    if len(roots) != 1 or not dataset:
        raise LtbenchError("data verify: expected 'ltbench data verify ROOT --dataset NAME' (one folder)")
    variant, lines = verify_files(Path(roots[0]), dataset)
    print(f"{roots[0]}: {variant or 'unknown variant'} ({dataset})")
    print("\n".join(f"  {line}" for line in lines))
    return 0 if variant else 1


def add_commands(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("verify", parents=[common], help="does each claim reproduce on these finished runs? "
                       "REPRODUCED / NOT REPRODUCED / INCONCLUSIVE / UNTESTED (docs/claims.md)")
    p.add_argument("path", help="a results directory or a recipe file")
    p.add_argument("overrides", nargs="*", help="a recipe's dotted overrides, as given to 'ltbench run'")
    p.add_argument("--claims", metavar="DIR", help="a folder of claim files (default: the claims shipped in ltbench/claims)")
    p.add_argument("--format", choices=["markdown", "csv", "json", "lines"], default="markdown",
                   help="lines: one line per judged number")
    p.add_argument("--margin", type=float, help="equivalence margin in points (default: each claim's, else 1)")
    p.add_argument("--export", metavar="DIR", help="write each configuration of the finished runs as a claim file")
    p.add_argument("--results", help="results directory, when PATH is a recipe")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("plan", parents=[common], help="what the declared seeds can detect per table comparison "
                       "(80 %% power), and the seeds a difference needs (docs/significance.md)")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="the dotted overrides given to 'ltbench run'")
    p.add_argument("--spread", type=float, help="seed-to-seed std in points, for rows without 2 finished seeds")
    p.add_argument("--detect", type=float, help="a difference in points: how many seeds per row detect it")
    p.add_argument("--results", help="results directory holding finished (pilot) runs of the recipe")
    p.set_defaults(func=cmd_plan)
