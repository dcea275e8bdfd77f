"""The protocol id: one short name for what makes two accuracies on "the same dataset" comparable.

``protocol_fields`` lists, per dataset, from a run's flat configuration (and the split-list digests its result
recorded), what must match: the training images (file variant or subset generator and seed), where
validation comes from, the evaluation preprocessing and the test priors. ``protocol_id`` hashes them into
``<dataset>-<10 hex>``; claims carry it and ``ltbench verify`` compares it. ``verify_files`` names the known
variant of a folder of data files from ``known_files.yaml``. No torch: imported on login nodes.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import yaml

from ltbench.errors import LtbenchError
from ltbench.results import store

SMALL_IMAGES = ("fashion_mnist_lt", "cifar10_lt", "cifar100_lt", "synthetic_lt")
SPLIT_LISTS = ("imagenet_lt", "places_lt", "inat2018")
LDAM_DRW = "LDAM-DRW (Cao et al., 2019): n_i = int(img_max * rho^(-i/(C-1))), legacy NumPy RNG"
GENERATORS = {  # how each built-in dataset draws its long-tailed training subset (docs/protocols.md)
    "cifar10_lt": LDAM_DRW, "cifar100_lt": LDAM_DRW,
    "fashion_mnist_lt": "ltbench: LDAM-DRW's exponential profile from n_max, legacy NumPy RNG",
    "synthetic_lt": "ltbench: generated images",
}


def known_variants() -> dict:
    return yaml.safe_load((resources.files("ltbench.results") / "known_files.yaml").read_text(encoding="utf-8"))


def _list_variant(digests: dict[str, str]) -> str:
    """A recorded list set as a known variant's name when every list is in one variant, else its digests."""
    for variants in known_variants().values():
        for v in variants:
            if digests and all(f"sha1:{d}" in v["files"].values() for d in digests.values()):
                return v["variant"]
    return "lists " + ", ".join(f"{k} sha1:{d}" for k, d in sorted(digests.items()))


def protocol_fields(flat: dict, lists: dict[str, str] | None = None) -> dict:
    """What defines the protocol of a run with this flat configuration (``data.name``, ``data.*``, ``eval.*``,
    ``backbone.name``); ``lists``: split name -> sha1 of the list file its result recorded (split-list data),
    None for a claim that names the published lists without digests."""
    name = flat.get("data.name")
    get = lambda key, default=None: flat.get(key, default)  # noqa: E731
    fields = {"dataset": name}
    if name in GENERATORS:
        fields["subset"] = {"generator": GENERATORS[name], "imb_factor": float(get("data.imb_factor", 100.0)),
                            "imb_type": get("data.imb_type", "exp"), "seed": int(get("data.data_seed", 0)),
                            "max_per_class": get("data.max_per_class")}
        fields["validation"] = (f"{get('data.val_per_class')} per class, unused training images"
                                if get("data.val_per_class") else "none")
    elif name in SPLIT_LISTS:
        fields["subset"] = _list_variant(lists) if lists else "the published lists (digests not recorded)"
        fields["test_list"] = get("data.test_split", "test")
        fields["validation"] = (f"list {get('data.val_split')}" if get("data.val_split") else
                                f"{get('data.val_per_class')} per class held out of the training list"
                                if get("data.val_per_class") else "none")
    else:  # a plugin dataset: its options (less where the files are) and the digest of its files
        fields["subset"] = {k: v for k, v in sorted(flat.items()) if k.startswith("data.") and k != "data.root"}
        fields["files"] = flat.get("data_identity")
    fields["eval"] = {"view": "as stored" if name in SMALL_IMAGES else f"resize + centre crop of {get('backbone.name')}",
                      "tte": get("eval.tte", "none"), **({"tte_expand": get("eval.tte_expand", 24)}
                                                           if get("eval.tte", "none") != "none" else {})}
    # The test prior: the balanced test set; shifted priors by SADE's construction (or its published lists).
    fields["target_priors"] = "balanced test; shifted: " + ("SADE's published lists" if name in SPLIT_LISTS else
                                                            "SADE's subsets of the balanced test set, NumPy seed 0")
    return fields


def protocol_id(flat: dict, lists: dict[str, str] | None = None) -> str:
    text = json.dumps(protocol_fields(flat, lists), sort_keys=True, default=str)
    return f"{flat.get('data.name')}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def record_lists(record: dict) -> dict[str, str] | None:
    """The list digests a split-list run's result recorded (``data.info.lists``), else None."""
    lists = ((record.get("data") or {}).get("info") or {}).get("lists")
    return {k: v["sha1"] for k, v in lists.items() if isinstance(v, dict) and "sha1" in v} if isinstance(lists, dict) else None


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with store.open_bounded(path, 64 * 1024 * store.MiB, follow=True) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_files(root: Path, dataset: str, table: dict | None = None) -> tuple[str | None, list[str]]:
    """(the known variant whose listed files ``root`` holds with their digests, or None; one line per file)."""
    variants = (table or known_variants()).get(dataset)
    if not variants:
        raise LtbenchError(f"--dataset {dataset}: no known file variants; known: {', '.join(sorted(table or known_variants()))}")
    lines: list[str] = []
    for v in variants:
        found = {rel: d for rel, d in v["files"].items() if (root / rel).is_file()}
        bad = [rel for rel, d in found.items() if f"{d.split(':')[0]}:{_digest(root / rel, d.split(':')[0])}" != d]
        if found and not bad:
            missing = sorted(set(v["files"]) - set(found))
            return v["variant"], [f"{v['variant']} ({v['source']}): {len(found)} file(s) match"
                                  + (f"; not present: {', '.join(missing)}" if missing else "")]
        lines += [f"{rel}: digest differs from {v['variant']}" for rel in bad]
    return None, lines or [f"{root}: none of the files of a known {dataset} variant is there"]


def command(roots: list[str], dataset: str | None) -> int:
    """``ltbench data verify ROOT --dataset NAME``: the known variant of the files in ROOT, or 'unknown variant'."""
    if len(roots) != 1 or not dataset:
        raise LtbenchError("data verify: expected 'ltbench data verify ROOT --dataset NAME' (one folder)")
    variant, lines = verify_files(Path(roots[0]), dataset)
    print(f"{roots[0]}: {variant or 'unknown variant'} ({dataset})")
    print("\n".join(f"  {line}" for line in lines))
    return 0 if variant else 1
