"""What a run is and what it leaves on disk: run identity, the run spec, the results store,
the self-describing record, provenance, predictions, and damage-tolerant reads. Torch-free."""
