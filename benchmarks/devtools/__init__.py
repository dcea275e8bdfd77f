"""Instruments for benchmarks and tests, never imported by a run: what a GPU would pay (launches and
host-device syncs) counted on the CPU (``gpu_cost``), and one training step of the real loop counted on it
(``step_cost``). Outside the package (benchmarks/), so the engine cannot depend on them; they reach into the
loop only by wrapping its functions from outside."""
