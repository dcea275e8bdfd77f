"""ltbench: a benchmark harness for long-tailed visual recognition."""

__version__ = "0.1.0"
