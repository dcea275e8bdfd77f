"""Paths that users and plugin authors depend on: the worker entry point and the plugin API imports."""

import subprocess
import sys


def test_the_worker_entry_point_keeps_its_path():
    out = subprocess.run([sys.executable, "-m", "ltbench.runner"], capture_output=True, text=True)
    assert out.returncode != 0 and "usage: python -m ltbench.runner" in out.stderr


def test_plugin_api_imports_are_where_the_docs_say():
    """What docs/adding-a-method.md, adding-a-dataset.md and posthoc.md tell plugin authors to import."""
    from ltbench.backbones import Backbone, ResNet32  # noqa: F401
    from ltbench.config import check_range  # noqa: F401
    from ltbench.data import DatasetBuilder, ImageSpec, LTData  # noqa: F401
    from ltbench.data.base import ArrayImages, data_roots, digest_files  # noqa: F401
    from ltbench.data.profile import exponential_counts, ldam_subset, subset_hash  # noqa: F401
    from ltbench.errors import ConfigError, CorruptFileError, DataMissingError  # noqa: F401
    from ltbench.experts import MultiExpert, split_experts  # noqa: F401
    from ltbench.method import Method, MethodContext  # noqa: F401
    from ltbench.posthoc import FrozenRun, PosthocMethod  # noqa: F401
    from ltbench.registry import DATASETS, METHODS  # noqa: F401
