"""Datasets: what a run trains and tests on, as plain tensors or lazily opened files."""

from ltbench.data.base import DatasetBuilder, ImageSpec, LTData

__all__ = ["DatasetBuilder", "ImageSpec", "LTData"]
