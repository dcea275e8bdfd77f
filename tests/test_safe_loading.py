"""CIFAR batches are unpickled with an allow-list: real batch contents load, anything else is refused unrun."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from ltbench.data.cifar import read_batch
from ltbench.errors import LtbenchError


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_batch_contents_load_with_every_protocol(tmp_path, protocol):
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": [3, 1], b"filenames": [b"a.png", b"b.png"],
             b"data": np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072), b"num_cases_per_batch": 2}
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(batch, protocol=protocol))
    got = read_batch(path)
    assert got["labels"] == [3, 1] and got["batch_label"] == b"training batch 1 of 5"
    assert np.array_equal(got["data"], batch[b"data"])


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # what a tampered file would do: call any function while it loads
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_pickle_that_calls_a_function_is_refused_before_the_call(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": _RunsCode(marker)}, protocol=protocol))
    with pytest.raises(LtbenchError, match=r"refused global (builtins|io)\.open"):
        read_batch(path)
    assert not marker.exists()
