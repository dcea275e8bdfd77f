"""The Slurm launcher's former path, kept for job arrays already queued.

submitit pickles the job callable by its import path: arrays submitted before the launcher moved to
``ltbench.run.slurm`` name ``ltbench.slurm.RunJob`` / ``ltbench.slurm.PosthocJob``, and a compute node
starting (or requeueing) one must still find them. Nothing in ltbench imports this module."""

from ltbench.run.slurm import PosthocJob, RunJob

__all__ = ["PosthocJob", "RunJob"]
