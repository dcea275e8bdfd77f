"""Running a grid: which runs still need doing (``launch``), the local pool and its progress lines, Slurm
arrays through submitit, and what ``ltbench status`` shows. Torch-free: every run itself goes through
``ltbench.runner.run_one`` (the worker; its path is kept for ``python -m ltbench.runner``)."""
