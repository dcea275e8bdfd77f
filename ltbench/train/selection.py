"""Model selection: which epoch's model a run reports.

Kept apart from the training loop so it can later move to report time (as DomainBed selects from
logged records): it reads only the final metrics and the rows of log.jsonl, never a model. No torch.

The reported model is the last epoch's (common long-tailed practice), or with ``eval.select: best_val`` the
epoch with the best validation All (a validation split, never the test set). When test accuracy was logged
during training (``train.eval_every``), the best epoch on the test set is recorded as well, under a
name that says what it is: an oracle, not a legitimate selection.
"""

from __future__ import annotations

from ltbench.results.schema import HEADLINE_METRICS


def headline(metrics: dict) -> dict:
    """The shot-group accuracies (all, many, medium, few) of a metrics dict."""
    return {g: metrics[g] for g in HEADLINE_METRICS}


def select_model(final_metrics: dict, log_rows: list[dict], epochs: int, strategy: str = "last") -> dict:
    """result.json's 'selection' record from the final metrics (those of the selected model) and the epoch log.

    ``best_val``: the epoch whose validation All (logged per epoch) is highest, the earliest of ties (the rule
    the engine used when it kept that epoch's model); its validation headline is recorded beside the epoch."""
    selection: dict = {"strategy": "last", "epoch": epochs}
    if strategy == "best_val":
        validated = [r for r in log_rows if r.get("val", {}).get("all") is not None]
        if validated:
            best = max(validated, key=lambda r: (r["val"]["all"], -r["epoch"]))
            selection = {"strategy": "best_val", "epoch": best["epoch"], "val": best["val"]}
    logged = [r for r in log_rows if "test" in r and r["epoch"] != selection["epoch"]]
    if logged:
        best = max(logged + [{"epoch": selection["epoch"], "test": headline(final_metrics)}],
                   key=lambda r: r["test"]["all"] if r["test"]["all"] is not None else -1)
        selection["oracle_best_on_test"] = {"epoch": best["epoch"], **best["test"]}
    return selection
