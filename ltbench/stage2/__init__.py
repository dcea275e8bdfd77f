"""Stage 2 on frozen features: the feature cache of a finished run and the stage-2 runs
(``ltbench posthoc``). The stage-2 method plugin API itself is ``ltbench.posthoc``."""
