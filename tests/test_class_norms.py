"""Methods with per-class norms record them in result.json (method_extras), like BAPE records kappa."""

import json

import pytest
import torch

from ltbench.method import MethodContext, create_method

CTX = MethodContext(num_classes=3, class_counts=torch.tensor([100, 10, 1]), feature_dim=4, epochs=2)


def extras(method) -> dict:
    return json.loads(json.dumps(method.result_extras(), allow_nan=False))  # what result.json will hold


def test_linear_heads_record_weight_norms_per_class():
    for name in ("la", "la_posthoc", "ce", "ce_drw"):
        method = create_method({"name": name}, CTX)
        with torch.no_grad():
            method.head.weight.copy_(torch.tensor([[3.0, 4, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]]))
        assert extras(method) == {"weight_norm": pytest.approx([5.0, 1.0, 2.0])}


def test_la_cosine_head_records_the_norm_of_each_class_column():
    method = create_method({"name": "la", "head": "cosine"}, CTX)
    with torch.no_grad():
        method.head.weight.copy_(torch.tensor([[3.0, 0, 1], [4, 2, 1], [0, 0, 1], [0, 0, 1]]))
    assert extras(method)["weight_norm"] == pytest.approx([5.0, 2.0, 2.0])


def test_la_test_normalize_also_records_the_mean_feature_norm():
    method = create_method({"name": "la", "test_normalize": True}, CTX)
    assert "feature_norm_mean" not in extras(method)  # nothing seen yet
    h = torch.tensor([[3.0, 4, 0, 0], [0, 0, 0, 1]])
    method.loss([h], torch.tensor([0, 1]), epoch=0)
    assert extras(method)["feature_norm_mean"] == pytest.approx(3.0)


def test_cosine_records_weight_norms_and_its_scale():
    method = create_method({"name": "cosine", "s": 16.0, "learn_scale": True}, CTX)
    with torch.no_grad():
        method.head.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 2, 0], [0, 0, 3], [0, 0, 4]]))
        method.scale.fill_(12.5)
    assert extras(method) == {"weight_norm": pytest.approx([1.0, 2.0, 5.0]), "scale": 12.5}


def test_bape_keeps_its_auxiliary_las_norms_beside_kappa():
    bape = create_method({"name": "bape", "hidden_dim": 8, "proj_dim": 4}, CTX)
    recorded = extras(bape)
    assert len(recorded["kappa"]) == 3 and len(recorded["aux"]["weight_norm"]) == 3
