"""The training loop (``engine``) and what it needs: checkpoints, model selection, distributed training
and experiment loggers. Imported by workers only (the engine imports torch); launchers, status and
tables never load it."""
