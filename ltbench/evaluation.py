"""The one evaluation core every method shares: per-class accuracy, shot groups, target priors.

Conventions (classifier-balancing ``shot_acc``, with its edge cases fixed):
- All = top-1 over test samples (micro);
- Many / Medium / Few = unweighted mean of per-class accuracies of the classes in the group,
  groups taken from *training* counts; classes with no test sample are excluded and counted;
  a group with no evaluable class is reported as None (never 0, never NaN).
"""

from __future__ import annotations

import numpy as np

from ltbench.data.profile import exponential_decay
from ltbench.priors import parse_prior
from ltbench.results.schema import SHOT_GROUPS


def per_class_accuracy(pred: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy per class, test samples per class); accuracy is NaN where a class has no sample."""
    pred, labels = np.asarray(pred), np.asarray(labels)
    n = np.bincount(labels, minlength=num_classes)
    hits = np.bincount(labels[pred == labels], minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(n > 0, hits / np.maximum(n, 1), np.nan)
    return acc, n


def shot_groups(train_counts, many_threshold: int = 100, few_threshold: int = 20) -> np.ndarray:
    """'many' (n > many_threshold), 'few' (n < few_threshold), else 'medium' (both bounds inclusive),
    from training counts: the one shot-group rule of every table."""
    n = np.asarray(train_counts)
    return np.where(n > many_threshold, "many", np.where(n < few_threshold, "few", "medium"))


def _mean_or_none(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def summarize(pred: np.ndarray, labels: np.ndarray, train_counts, many_threshold: int = 100,
              few_threshold: int = 20) -> dict:
    """All / Many / Medium / Few (fractions in [0, 1]) plus per-class accuracy and group bookkeeping."""
    train_counts = np.asarray(train_counts)
    k = len(train_counts)
    acc, n_test = per_class_accuracy(pred, labels, k)
    groups = shot_groups(train_counts, many_threshold, few_threshold)
    out: dict = {"all": float((np.asarray(pred) == np.asarray(labels)).mean()) if len(labels) else None}
    for g in SHOT_GROUPS:
        out[g] = _mean_or_none(acc[groups == g])
    out["macro"] = _mean_or_none(acc)
    out["per_class"] = [None if np.isnan(a) else float(a) for a in acc]
    out["groups"] = {
        "many_threshold": many_threshold,
        "few_threshold": few_threshold,
        "n_classes": {g: int((groups == g).sum()) for g in SHOT_GROUPS},
        "n_classes_evaluated": {g: int(((groups == g) & (n_test > 0)).sum()) for g in SHOT_GROUPS},
        "classes_without_test_samples": int((n_test == 0).sum()),
    }
    return out


def accuracy_under_prior(per_class_acc, prior) -> float | None:
    """Expected top-1 on a test distribution with class prior ``prior``: sum_c prior_c * acc_c. Use it with the per-class accuracy of predictions made *for* that prior (prior-adapted), so
    shifted-test tables need one pass over a balanced test set, not one test set per prior.
    Classes without accuracy (no test sample) are dropped and the prior renormalised."""
    acc = np.array([np.nan if a is None else a for a in per_class_acc], dtype=float)
    prior = np.asarray(prior, dtype=float)
    ok = ~np.isnan(acc) & (prior > 0)
    if not ok.any():
        return None
    return float((acc[ok] * prior[ok]).sum() / prior[ok].sum())


def target_prior_metrics(names, train_counts, labels, predict_for, many_threshold: int,
                         few_threshold: int) -> dict:
    """metrics.target_priors, one rule for trained runs and stage-2 results alike: for each named shifted
    prior, the prediction adapted to it (``predict_for(prior)`` -> argmax per test image); 'all' is its
    per-class accuracy weighted by the prior (the test set stays balanced), groups are unweighted."""
    out = {}
    for name in names:
        direction, rho = parse_prior_name(name)
        prior = longtail_prior(train_counts, rho, direction)
        s = summarize(predict_for(prior), labels, train_counts, many_threshold, few_threshold)
        out[name] = {"all": accuracy_under_prior(s["per_class"], prior), **{g: s[g] for g in SHOT_GROUPS}}
    return out


def label_prior(labels, num_classes: int) -> np.ndarray:
    """The class frequencies of a test set: the known prior a shifted test set is predicted with."""
    return np.bincount(labels, minlength=num_classes) / max(len(labels), 1)


def longtail_prior(train_counts, imb_factor: float, direction: str) -> np.ndarray:
    """LADE/SADE shifted test prior: classes ranked by training count (descending); the k-th gets weight
    (1/rho)^(k/(C-1)) ('forward') or (1/rho)^((C-1-k)/(C-1)) ('backward'); 'uniform' gives equal weights."""
    train_counts = np.asarray(train_counts)
    c = len(train_counts)
    if direction == "uniform" or imb_factor == 1:
        return np.full(c, 1.0 / c)
    order = np.argsort(-train_counts, kind="stable")
    rank = np.empty(c, dtype=float)
    rank[order] = np.arange(c)
    if c == 1:
        return np.ones(1)
    w = exponential_decay(rank if direction == "forward" else (c - 1 - rank), c, imb_factor)
    return w / w.sum()


def parse_prior_name(name: str) -> tuple[str, float]:
    """'forward50' -> ('forward', 50.0); 'uniform' -> ('uniform', 1.0). ValueError for anything else
    (the one grammar: ltbench/priors.py, which also validates recipes before any run)."""
    return parse_prior(name)
