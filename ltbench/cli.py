"""Command line: ``ltbench run | posthoc | list | data | table | report | plot | status | verify | plan``.

A problem the user can fix is printed as one line on stderr with a non-zero exit and no traceback
(``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path

from ltbench.errors import ConfigError, LtbenchError, shorten
from ltbench.run.screen import VERBOSE_ENV
from ltbench.results.schema import SHOT_GROUPS

EXIT_USER_ERROR = 2
MESSAGE_LIMIT = 1000  # one line: the field, what was expected, how to fix it; echoed values are cut at 200


def load_checked_recipe(path, overrides: list[str] = (), results: str | None = None, where: dict | None = None):
    """recipe.load_recipe, then the check that every declared table can be built from its runs (which
    needs report/, so the recipe cannot do it itself): a broken table stops a launch before any run. The
    expansion is kept for the next status and table (report.expected.load_and_remember)."""
    from ltbench.report.expected import load_and_remember  # lazy: keeps --help fast
    from ltbench.results import store  # lazy: keeps --help fast

    recipe = load_and_remember(path, overrides, results, where=where)
    store.guard_writes_under(recipe.root)  # nothing written through a symlinked folder out of it (docs/trust.md)
    return recipe


def cmd_run(args) -> int:
    from ltbench.recipe.selection import parse_where  # lazy: keeps --help fast

    where = parse_where(args.where)  # a malformed --where is refused before anything is imported or expanded
    from ltbench.run import launch  # lazy: keeps --help fast
    recipe = load_checked_recipe(args.recipe, args.overrides, args.results, where)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # read by the progress lines, here and in the workers
    if args.launcher:
        recipe.launcher.name = args.launcher
    if args.jobs:
        recipe.launcher.jobs = args.jobs
    if args.dry_run:
        from ltbench.report.plan import dry_run_lines  # lazy: keeps --help fast
        code = launch.print_plan(recipe)
        for line in dry_run_lines(recipe):  # what the seeds can detect
            print(line)
        return code
    summary = launch.launch(recipe, rerun_failed=args.rerun_failed, wait=args.wait, rerun_stale=args.rerun_stale,
                            rebuild_checkpoints=args.rebuild_checkpoints)
    return 0 if summary.get("failed", 0) == 0 else 1


def cmd_posthoc(args) -> int:
    """The recipe's stage-2 grid over its finished runs (docs/posthoc.md)."""
    from ltbench.run.launch import launch_posthoc  # lazy: keeps --help fast
    recipe = load_checked_recipe(args.recipe, args.overrides, args.results)
    if not recipe.posthoc:
        raise LtbenchError(f"{args.recipe}: posthoc: no stage-2 settings declared; add a 'posthoc:' list, e.g. "
                           f"[{{name: tau_norm, tau: [0, 0.5, 1]}}] (docs/posthoc.md)")
    if args.launcher:
        recipe.launcher.name = args.launcher
    jobs = args.jobs or recipe.launcher.jobs
    print(f"recipe {recipe.name}: {len(recipe.posthoc)} stage-2 setting(s) x {len(recipe.runs)} run(s), "
          f"launcher {recipe.launcher.name}" + (f", {jobs} job(s)" if recipe.launcher.name == "local" else ""))
    totals = launch_posthoc(recipe, jobs=jobs, dtype=args.dtype, redo_failed=args.rerun_failed,
                            redo_stale=args.rerun_stale)
    skipped = totals.pop("skipped_runs", [])
    print("stage 2: " + ", ".join(f"{v} {k}" for k, v in totals.items() if v and k != "stale"))
    if totals.get("stale"):
        print(f"  {totals['stale']} stage-2 result(s) were fitted by stage-2 code that has changed since (counted in "
              f"'already'); add --rerun-stale to fit them again")
    if skipped:
        print(f"{len(skipped)} run(s) SKIPPED (their stage-2 results are missing from every table):")
        for line in skipped:
            print(f"  {line}".replace("RECIPE", str(args.recipe)))
    return 0 if not any(totals.get(k) for k in ("failed", "unfinished", "skipped")) else 1


def cmd_list(args) -> int:
    """Each registered plugin of a kind: what it is and where it comes from; with ``--options`` every
    option of its Config (type, default, one line of doc), read from the dataclass (config.describe_options)."""
    from ltbench.config import OptionDoc  # lazy: keeps --help fast
    from ltbench.recipe.expansion import plugin_listing  # lazy: keeps --help fast

    entries = plugin_listing(args.plugins or [])[args.kind]
    if args.names:
        known = {e["name"] for e in entries}
        for name in args.names:
            if name not in known:  # the registry's words (did you mean, where it searched): discovery, rarely
                from ltbench import registry  # lazy: keeps list free of torch (only an unknown name pays for discovery)

                registry.add_plugin_paths(args.plugins or [])
                raise LtbenchError(f"ltbench list {args.kind}: {registry.REGISTRIES[args.kind].unknown_message(name)}")
        entries = [e for e in entries if e["name"] in args.names]
    width = max((len(e["name"]) for e in entries), default=4)
    for e in entries:  # two lines: what it is (at most LIST_WIDTH characters), then where it comes from
        line = f"{e['name']:<{width}}  {e['doc']}".rstrip()
        print(line if len(line) <= LIST_WIDTH else line[:LIST_WIDTH - 1] + "…")
        print(f"{'':<{width}}  from {e['source']} ({e['module']})")  # a path is never cut
        if args.options:
            print_options([OptionDoc(*o) for o in e["options"]], " " * (width + 4))
    return 0


def print_options(options: list, indent: str) -> None:
    """One line per option: name, type, default, doc (columns aligned within the plugin; docs never cut)."""
    if not options:
        print(f"{indent}(no options)")
        return
    name_w = max(len(o.name) for o in options)
    type_w = min(max(len(o.type) for o in options), 40)
    default_w = min(max(len(o.default) for o in options), 24)
    for o in options:
        print(f"{indent}{o.name:<{name_w}}  {o.type:<{type_w}}  {o.default:<{default_w}}  {o.doc}".rstrip())


LIST_WIDTH = 100  # 'ltbench list' lines fit a terminal


def cmd_data(args) -> int:
    if args.recipe == "verify":  # ltbench data verify ROOT --dataset NAME
        from ltbench.results import protocol  # lazy: keeps --help fast
        return protocol.command(args.overrides, args.dataset)
    from ltbench.recipe import distinct_data  # lazy: keeps --help fast

    recipe = load_checked_recipe(args.recipe, args.overrides)  # validate before importing the engine (seconds)
    from ltbench.train import engine  # lazy: keeps table and status free of torch
    from ltbench.evaluation import shot_groups  # lazy: keeps --help fast
    from ltbench.train import resources  # lazy: keeps table and status free of torch
    from ltbench.results import protocol  # lazy: keeps --help fast
    from ltbench.report.rows import flatten  # lazy: keeps --help fast
    from ltbench.results.identity import identity_of  # lazy: keeps --help fast

    resources.check_data(distinct_data(recipe.runs), recipe.launcher, str(args.recipe))  # before any allocation
    reports = []
    for spec in distinct_data(recipe.runs):
        data = engine.load_data(spec.config)
        e = spec.config["eval"]
        groups = shot_groups(data.class_counts, e["many_threshold"], e["few_threshold"])
        reports.append({
            "data": spec.config["data"],
            "num_classes": data.num_classes,
            "train_total": int(data.class_counts.sum()),
            "test_total": int(data.test_counts.sum()),
            "subset_hash": data.subset_hash,
            "classes": [{"class": c, "name": (data.class_names or [None] * data.num_classes)[c],
                         "train": int(data.class_counts[c]), "test": int(data.test_counts[c]), "group": str(groups[c])}
                        for c in range(data.num_classes)],
            "groups": {g: int((groups == g).sum()) for g in SHOT_GROUPS},
            "protocol_id": protocol.protocol_id(flatten(identity_of(spec.config)), protocol.record_lists({"data": {"info": data.info}})),
        })
        if data.val_counts is not None:  # the validation split (docs/protocol.md)
            reports[-1]["val_total"] = int(data.val_counts.sum())
            for c, entry in enumerate(reports[-1]["classes"]):
                entry["val"] = int(data.val_counts[c])
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    from tabulate import tabulate

    for r in reports:
        opts = ", ".join(f"{k}={v}" for k, v in r["data"].items() if k != "root")
        print(f"{opts}\ntrain {r['train_total']} images, test {r['test_total']}, subset sha1 {r['subset_hash'][:12]}; "
              f"groups: many {r['groups']['many']}, medium {r['groups']['medium']}, few {r['groups']['few']}; "
              f"protocol {r['protocol_id']} (docs/claims.md)")
        val = "val_total" in r
        if val:
            print(f"validation {r['val_total']} images (never trained on; docs/protocol.md)")
        rows = [[c["class"], c["name"] or "", c["train"], c["test"]] + ([c["val"]] if val else []) + [c["group"]]
                for c in r["classes"]]
        if len(rows) > 40:
            rows = rows[:20] + [["..."] + [""] * (len(rows[0]) - 1)] + rows[-20:]
        headers = ["class", "name", "train", "test"] + (["val"] if val else []) + ["group"]
        print(tabulate(rows, headers=headers, tablefmt="github"))
        print()
    return 0


def cmd_table(args) -> int:
    from ltbench.recipe.selection import parse_where  # lazy: keeps --help fast

    where = parse_where(args.where)
    from ltbench import report  # lazy: keeps --help fast

    heads = [h.strip() for h in args.heads.split(",") if h.strip()] if args.heads else None
    test = None if args.test == "none" else args.test
    built = report.tables(args.path, args.results, name=args.table, heads=heads, test=test,
                          use_cache=not args.no_cache, published=True if args.published else None,
                          overrides=args.overrides, digits=args.digits, select=args.select,
                          correction=None if args.correction == "none" else args.correction,
                          where=where, notes=args.notes)
    if args.trials:
        from ltbench.report.tuned import export_recipe, trials_of  # lazy: keeps --help fast
        if args.export:
            print(export_recipe(built, args.trials, Path(args.path), list(args.overrides or []), Path(args.export)))
            return 0
        print(trials_of(built, args.trials, args.digits if args.digits is not None else 2))
        return 0
    if args.export:
        raise ConfigError("--export writes the fixed recipe of a tuned row: give the row with --trials ROW")
    text = report.render_all(built, args.format or "markdown")
    if args.format is None and sys.stdout.isatty():  # a terminal: bold and underline as ANSI, as 'run' ends
        from ltbench.run.screen import for_terminal  # lazy: keeps --help fast

        text = for_terminal(text)
    print(text)
    return 0


def cmd_report(args) -> int:
    from ltbench.report.document import write_report  # lazy: keeps the other commands free of matplotlib

    out = write_report(args.recipe, args.results, test=None if args.test == "none" else args.test,
                       overrides=args.overrides, use_cache=not args.no_cache, size=args.size)
    print(f"report written to {out / 'report.md'} and {out / 'report.html'} (open it in a browser)")
    return 0


def cmd_plot(args) -> int:
    from ltbench import report  # lazy: keeps --help fast
    from ltbench.report.document import draw  # lazy: keeps the other commands free of matplotlib

    frames = report.load(args.path, args.results, overrides=args.overrides)
    _, _, root = report.source(args.path, args.results, overrides=args.overrides)
    out_dir = Path(args.out) if args.out else Path(root) / "report" / "figures"
    drawn = draw(args.kind, frames, out_dir / args.kind, args.size)
    if not drawn.paths:
        raise LtbenchError(f"{args.path}: {drawn.reason}")
    print("\n".join(drawn.paths))
    for stem, text in drawn.captions.items():  # no title is drawn in a figure: this is for the paper's caption
        print(f"caption ({stem}): {text}")
    return 0


def cmd_migrate(args) -> int:
    from ltbench.results import migrate  # lazy: keeps --help fast

    root = Path(args.folder)
    if not root.is_dir():
        raise LtbenchError(f"{root}: not a folder; expected a results folder (e.g. results/ or results/quickstart)")
    report = migrate.migrate_folder(root, dry_run=args.dry_run)
    print("\n".join(report.lines(root, args.dry_run)))
    return 0


def cmd_check(args) -> int:
    from ltbench.contract import check_plugin_folder, check_recipe  # lazy: keeps table and status free of torch

    target = Path(args.folder)
    if target.is_file() and target.suffix in (".yaml", ".yml"):
        from ltbench.recipe import load_recipe  # lazy: keeps --help fast

        return check_recipe(load_recipe(target), args.data_root)
    return check_plugin_folder(args.folder, args.data_root)


def cmd_status(args) -> int:
    from ltbench.recipe.selection import parse_where  # lazy: keeps --help fast

    where = parse_where(args.where)
    from ltbench.run import run_status_view  # lazy: keeps --help fast
    from ltbench.report.expected import status_runs  # lazy: keeps --help fast

    p = Path(args.path)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        root, runs, keys = status_runs(p, args.overrides, args.results, where)  # no torch when the expansion is cached
        if not Path(root).is_dir():  # launched from elsewhere, or never: say where it looked, first
            from ltbench.recipe import no_results_message, read_recipe_file  # lazy: keeps --help fast

            print(no_results_message(p, read_recipe_file(p, args.overrides)[0], Path(root), args.results))
        return run_status_view.print_status(root, runs, keys)
    if args.overrides:
        raise LtbenchError(f"{p}: overrides ({args.overrides[0]}, ...) need a recipe file, not a results folder")
    if not p.is_dir():
        raise LtbenchError(f"{p}: no such results directory or recipe file")
    return run_status_view.print_status(p, where=where)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2) like every other bad input."""

    def error(self, message: str):
        typed = [w.split("=")[0] for w in message.split() if w.startswith("--")] if "unrecognized" in message else []
        close = [m for w in typed for m in difflib.get_close_matches(w, list(self._option_string_actions), n=1)]
        hint = f" (did you mean {close[0]}?)" if close else ""
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {shorten(message, 300)}{hint} (see '{self.prog} --help')\n")


def _add_where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--where", action="append", metavar="KEY=VALUE[,VALUE]",
                   help="only the runs with one of these values at this dotted key (repeatable), e.g. "
                        "--where data.imb_factor=10,100 --where seed=0 (docs/tables.md)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {shorten(repr(text), 60)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ltbench", description="Benchmark harness for long-tailed recognition")
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks (accepted anywhere on the line)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run_commands(sub, common)
    _add_result_commands(sub, common)
    return parser


def _add_run_commands(sub, common: argparse.ArgumentParser) -> None:
    """Commands that launch, describe or check runs: run, list, data, status, check."""
    p = sub.add_parser("run", parents=[common], help="expand a recipe into runs and execute the unfinished ones")
    p.add_argument("recipe", help="a recipe file (YAML): datasets, methods, grid and seeds, e.g. recipes/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=0.05 seeds=[0,1,2]")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their ids, run nothing")
    _add_where(p)
    p.add_argument("--results", help="results directory (default: the recipe's results_dir, 'results')")
    p.add_argument("--launcher", choices=["local", "slurm", "debug"],
                   help="where the runs execute (default: the recipe's launcher:, else local): local = this machine "
                        "(--jobs N worker processes), slurm = job arrays through submitit (returns after submitting; "
                        "--wait follows them), debug = submitit's in-process executor (tests a Slurm set-up here)")
    p.add_argument("--jobs", type=_positive_int, help="local launcher: worker processes (>= 1)")
    p.add_argument("--rerun-failed", action="store_true", help="run again the runs whose status is failed")
    p.add_argument("--rerun-stale", action="store_true",
                   help="run again (from scratch) finished runs made by code that has changed since (status says which)")
    p.add_argument("--wait", action="store_true", help="slurm: wait for the jobs, then print the table")
    p.add_argument("--verbose", action="store_true",
                   help="a line per epoch also when the output is not a terminal (a log file gets starts and ends)")
    p.add_argument("--rebuild-checkpoints", action="store_true",
                   help="train again finished runs whose final checkpoint.pt is missing or unusable (stage 2 needs it)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("posthoc", parents=[common],
                       help="fit the recipe's stage-2 grid (posthoc:) on the frozen features of its finished runs")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="the dotted overrides given to 'ltbench run'")
    p.add_argument("--results", help="results directory (default: the recipe's results_dir, 'results')")
    p.add_argument("--launcher", choices=["local", "slurm", "debug"],
                   help="local: worker processes here (--jobs); slurm: one array task per finished run")
    p.add_argument("--jobs", type=_positive_int, help="runs processed at a time (default: the recipe's launcher.jobs)")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="feature cache precision")
    p.add_argument("--rerun-failed", action="store_true", help="fit again the stage-2 settings that failed")
    p.add_argument("--rerun-stale", action="store_true",
                   help="fit again the stage-2 results made by code that has changed since")
    p.set_defaults(func=cmd_posthoc)

    _add_list_command(sub, common)

    p = sub.add_parser("data", parents=[common], help="per-class train/test counts and shot groups of a recipe's datasets; "
                       "'data verify ROOT --dataset NAME': which known variant of the files ROOT holds")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dataset", help="with 'data verify': the dataset whose files ROOT holds")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("status", parents=[common], help="state of each run, read from disk")
    p.add_argument("path", help="a results directory or a recipe file")
    p.add_argument("overrides", nargs="*", help="a recipe's dotted overrides, as given to 'ltbench run'")
    p.add_argument("--results", help="results directory, when PATH is a recipe")
    _add_where(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("migrate", parents=[common],
                       help="bring the records of a results folder written by an older ltbench up to date")
    p.add_argument("folder", help="a results folder (all recipes below it) or one recipe's results folder")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("check", parents=[common],
                       help="run the plugin contract on a plugin folder (methods, backbones, datasets, stage-2 "
                            "methods), or on a recipe's plugins and datasets")
    p.add_argument("folder", help="a plugin folder, as listed under 'plugins:' in a recipe, or a recipe file (its "
                                  "plugin folders, and its datasets loaded with its data: sections)")
    p.add_argument("--data-root", help="load datasets from this folder (their 'root' option); a dataset whose "
                                       "files are not found is 'skipped', never 'ok'")
    p.set_defaults(func=cmd_check)


def _add_list_command(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("list", parents=[common], help="registered methods, datasets, backbones, samplers, stage-2 methods or tune modes and where they come from")
    p.add_argument("kind", choices=["methods", "datasets", "backbones", "posthoc", "samplers", "tune_modes"])  # registry.REGISTRIES)
    p.add_argument("names", nargs="*", help="only these names (e.g. 'ltbench list methods NAME --options')")
    p.add_argument("--options", action="store_true",
                   help="every option of each: name, type, default (as a recipe writes it) and one line of doc")
    p.add_argument("--plugins", nargs="*", help="extra plugin folders")
    p.set_defaults(func=cmd_list)


def _add_result_commands(sub, common: argparse.ArgumentParser) -> None:
    """Commands that turn finished runs into tables, reports and figures: table, report, plot."""
    p = sub.add_parser("table", parents=[common], help="paper-style tables: the recipe's declared tables, or one row per configuration")
    p.add_argument("path", help="a results directory or a recipe file")
    p.add_argument("overrides", nargs="*", help="a recipe's dotted overrides, as given to 'ltbench run'")
    p.add_argument("--table", help="print only this declared table")
    p.add_argument("--format", choices=["markdown", "latex", "csv"],
                   help="default: markdown, shown with ANSI bold and underline on a terminal (markdown as it is "
                        "when written to a file or a pipe, or with --format markdown)")
    p.add_argument("--digits", type=int, choices=range(0, 7), metavar="0..6", help="decimals (default: the table's, 2)")
    p.add_argument("--heads", help="rows for these prediction heads (fnmatch patterns, comma-separated), "
                                   "e.g. 'sum_da_*' for every head whose name starts with sum_da_")
    p.add_argument("--test", choices=["welch", "bootstrap", "image_bootstrap", "none"], default="welch",
                   help="mark cells not significantly different from the best, and test the versus differences: "
                        "welch (over seeds, the default), bootstrap (two-level: seeds, then test images), "
                        "image_bootstrap (test images only: these trained models on this test set); "
                        "docs/significance.md")
    p.add_argument("--correction", choices=["none", "holm", "holm:row", "holm:column"],
                   help="Holm's correction of the versus p-values: over the whole block, within each row pair "
                        "(shot groups, priors) or within each column (default: the table's 'correction:', else none)")
    p.add_argument("--published", action="store_true", help="add matching published results (dagger rows, delta)")
    p.add_argument("--notes", choices=["auto", "full", "short", "none"],
                   help="LaTeX notes under the table (default: the table's 'notes:', auto: full while the float fits "
                        "the page's height, else short: the legend and each row note cut to two lines)")
    p.add_argument("--trials", metavar="ROW", help="the trials of this tuned row (its draws, validation All on each "
                   "tuning seed, device-hours, the one chosen) instead of the table")
    p.add_argument("--export", metavar="FILE.yaml", help="with --trials ROW: write a fixed recipe of the row's chosen "
                   "configuration on its report seeds (its runs have the tuned row's run ids; no search)")
    p.add_argument("--select", choices=["val", "test"], help="a row matching several settings takes, per seed, the one "
                   "with the best validation All (val) or test All (test: labelled an oracle); docs/protocol.md")
    p.add_argument("--no-cache", action="store_true",
                   help="read every result.json again and rewrite the index and expansion caches")
    p.add_argument("--results", help="results directory, when PATH is a recipe")
    _add_where(p)
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("report", parents=[common], help="write results/<recipe>/report/: every table (md/tex/csv), figures, report.md, report.html")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="the dotted overrides given to 'ltbench run'")
    p.add_argument("--results", help="results directory (default: the recipe's results_dir)")
    p.add_argument("--test", choices=["welch", "bootstrap", "image_bootstrap", "none"], default="welch")
    p.add_argument("--size", choices=["column", "text"], default="column",
                   help="figure width: one column (3.3 in, the default) or the text width (6.9 in)")
    p.add_argument("--no-cache", action="store_true",
                   help="read every result.json again and rewrite the index and expansion caches")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("plot", parents=[common], help="figures (PNG and PDF): per-class accuracy, per-class statistics, prior shift, training curves")
    p.add_argument("path", help="a results directory or a recipe file")
    p.add_argument("overrides", nargs="*", help="a recipe's dotted overrides, as given to 'ltbench run'")
    p.add_argument("--kind", choices=["per_class", "class_stats", "kappa", "shift", "curves", "search"], required=True,
                   help="class_stats: one figure per recorded per-class statistic (kappa: its earlier name)")
    p.add_argument("--size", choices=["column", "text"], default="column",
                   help="figure width: one column (3.3 in, the default) or the text width (6.9 in); fonts >= 7 pt")
    p.add_argument("--out", help="folder for the figure files (default: <results>/<recipe>/report/figures)")
    p.add_argument("--results", help="results directory, when PATH is a recipe")
    p.set_defaults(func=cmd_plot)

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
    p.set_defaults(func=lambda args: _lazy("ltbench.report.verify").command(args))

    p = sub.add_parser("plan", parents=[common], help="what the declared seeds can detect per table comparison "
                       "(80 %% power), and the seeds a difference needs (docs/significance.md)")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="the dotted overrides given to 'ltbench run'")
    p.add_argument("--spread", type=float, help="seed-to-seed std in points, for rows without 2 finished seeds")
    p.add_argument("--detect", type=float, help="a difference in points: how many seeds per row detect it")
    p.add_argument("--results", help="results directory holding finished (pilot) runs of the recipe")
    p.set_defaults(func=lambda args: _lazy("ltbench.report.plan").command(args))


def _lazy(module: str):
    import importlib  # lazy: keeps --help fast (verify and plan import scipy and the table modules)
    return importlib.import_module(module)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options anywhere on the line: ``run X --debug``, ``run X --results D seeds=[0]`` and
    ``--debug run X`` all parse (argparse alone stops at the first option after the positionals).

    The top-level parser only picks the command; the command's own parser then reads the rest with
    ``parse_intermixed_args``, which lets options and positional overrides interleave.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    top_debug = False
    while argv and argv[0] == "--debug":
        top_debug = True
        argv.pop(0)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if not argv or argv[0] not in subparsers.choices:
        return parser.parse_args(argv)  # --help, or an unknown command: argparse's own message
    command = subparsers.choices[argv[0]]
    try:
        args = command.parse_intermixed_args(argv[1:])
    except TypeError:  # a command whose arguments argparse cannot intermix (e.g. nargs=REMAINDER)
        args = command.parse_args(argv[1:])
    args.command = argv[0]
    args.debug = getattr(args, "debug", False) or top_debug
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.func(args)
    except LtbenchError as exc:
        if args.debug:
            raise
        print(f"ltbench: error: {shorten(str(exc), MESSAGE_LIMIT)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as exc:  # the file system refused (read-only folder, a file where a folder should be, EFBIG)
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"ltbench: error: {shorten(where + (exc.strerror or str(exc)), MESSAGE_LIMIT)}; fix that path or "
              f"choose another one", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("ltbench: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except SystemExit as exc:  # ltbench's commands never exit: plugin code did, where no hook names it
        if args.debug:
            raise
        print(f"ltbench: error: plugin code called sys.exit({shorten(repr(exc.code), 60)}) during '{args.command}'; "
              f"a plugin must raise an error instead (--debug shows where)", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # a bug, not bad input: still one line unless --debug
        if args.debug:
            raise
        print(f"ltbench: internal error: {type(exc).__name__}: {shorten(str(exc), MESSAGE_LIMIT)} "
              f"(run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
