"""The JSON depth bound of results/store.py: read from the text, equal to the depth of the parsed values."""

from __future__ import annotations

import json
import random

import pytest

from ltbench.results import store


def _depth(value) -> int:
    """Nesting depth of parsed JSON values (a scalar 0, ``[]`` 1): the reference the text check must equal."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


TRICKY = ['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '"]]]', 'x\\\\"[', '\u00e9[', '😀{']


def _random_value(rng: random.Random, depth: int):
    kind = rng.random()
    if depth > 0 and kind < 0.4:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if depth > 0 and kind < 0.8:
        return {rng.choice(TRICKY) + str(i): _random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}
    return rng.choice([None, True, 1.5, -3, "plain", *TRICKY])


@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("indent", [None, 2])
def test_the_text_depth_bound_equals_the_depth_of_the_values(ensure_ascii, indent):
    rng = random.Random(0)
    for _ in range(400):
        value = _random_value(rng, rng.randint(0, 9))
        raw = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent).encode()
        assert store.parse_json(raw, "x.json") == value
        depth = _depth(value)
        if depth:
            assert not store._too_deep(raw, depth)
            assert store._too_deep(raw, depth - 1)


def test_a_file_one_level_too_deep_is_refused_and_brackets_in_strings_do_not_count():
    at_bound = "[" * 64 + '"]]]]\\" [[[["' + "]" * 64
    assert store.parse_json(at_bound.encode(), "ok.json")
    over = '{"a": ' + at_bound + "}"
    with pytest.raises(store.UnusableFile, match=r"deep.json: is nested more than 64 levels deep"):
        store.parse_json(over.encode(), "deep.json")
    with pytest.raises(store.UnusableFile, match="nested more than 3 levels"):
        store.parse_json(b'{"k": [{"x": []}], "s": "{{{{"}', "d.json", max_depth=3)
    assert store.parse_json(b'{"k": [{"x": 1}], "s": "[[[[\\\\"}', "d.json", max_depth=3)
