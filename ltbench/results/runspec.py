"""``RunSpec``: what a launcher hands to a worker, typed.

A run spec crosses process boundaries (spec.json on disk, a submitit pickle, a pool queue), so it
stays plain data: names and options, never models, datasets or classes. The worker repeats plugin
discovery from ``plugins`` and rebuilds everything from ``config``. Inside a process a run is a RunSpec
(``Recipe.runs``, the launchers, status, stage 2); ``to_dict``/``from_dict`` are the one conversion to and
from the plain form, used where a spec leaves the process (spec.json, a submitit pickle) and where one
comes back (``runner.run_one`` coerces what it is given). No torch here: launchers and the login node import it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields


@dataclass
class RunSpec:
    recipe: str  # the recipe's name (results/<recipe>/<run_id>/)
    run_id: str  # hash of the resolved config (ltbench.results.identity.run_id)
    config: dict  # the resolved configuration: data, backbone, method, optim, train, eval, seed
    grid: dict = field(default_factory=dict)  # the grid point that produced this run (dotted key -> value)
    plugins: list = field(default_factory=list)  # plugin folders/modules to import in the worker
    run_dir: str = ""  # where the run's files live

    @property
    def seed(self) -> int:
        return self.config["seed"]

    def to_dict(self) -> dict:
        """The plain form written to spec.json (keys in field order)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, spec: dict) -> RunSpec:
        """From the plain form; 'grid' and 'plugins' may be absent (older specs, hand-written ones)."""
        missing = [k for k in ("recipe", "run_id", "config") if k not in spec]
        if missing:
            raise ValueError(f"run spec is missing {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in spec.items() if k in known})

    @classmethod
    def coerce(cls, spec: RunSpec | dict) -> RunSpec:
        return spec if isinstance(spec, RunSpec) else cls.from_dict(spec)
