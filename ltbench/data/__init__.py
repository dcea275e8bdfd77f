"""Datasets: what a run trains and tests on, as plain tensors or lazily opened files.

The names below are loaded on first use (PEP 562), so torch-free modules (``evaluation``, ``plots``)
can use ``ltbench.data.profile`` without importing torch.
"""

__all__ = ["DatasetBuilder", "ImageSpec", "LTData"]


def __getattr__(name: str):
    if name in __all__:
        from ltbench.data import base  # lazy: keeps ltbench.data.profile users free of torch

        return getattr(base, name)
    raise AttributeError(f"module 'ltbench.data' has no attribute {name!r}")
