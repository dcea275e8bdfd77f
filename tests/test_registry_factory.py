"""Registry.config / resolved / build: the one factory from ``{name, **options}``."""

from dataclasses import dataclass

import pytest

from ltbench.errors import ConfigError
from ltbench.registry import Registry, RegistryError

WIDGETS = Registry("widget", "ltbench.test_widgets")


@WIDGETS.register("knob")
class Knob:
    @dataclass
    class Config:
        size: int = 3
        color: str = "red"

    def __init__(self, cfg, owner, *, scale=1):
        self.cfg, self.owner, self.scale = cfg, owner, scale


def test_config_validates_and_fills_defaults():
    cfg = WIDGETS.config({"name": "knob", "size": 5}, "widget")
    assert (cfg.size, cfg.color) == (5, "red")
    assert WIDGETS.resolved({"name": "knob", "size": 5}, "widget") == {"name": "knob", "size": 5, "color": "red"}


def test_build_passes_the_config_and_the_arguments():
    spec = {"name": "knob", "color": "blue"}
    knob = WIDGETS.build(spec, "me", scale=2, where="widget")
    assert (knob.cfg.color, knob.cfg.size, knob.owner, knob.scale) == ("blue", 3, "me", 2)
    assert spec == {"name": "knob", "color": "blue"}  # the caller's spec is not changed


def test_bad_options_and_names_are_named():
    with pytest.raises(ConfigError, match=r"widget\.size"):
        WIDGETS.config({"name": "knob", "size": "big"}, "widget")
    with pytest.raises(ConfigError, match=r"widget\.colour: unknown key \(did you mean 'color'\?\)"):
        WIDGETS.build({"name": "knob", "colour": "red"}, None, where="widget")
    with pytest.raises(RegistryError, match="unknown widget 'knb'. Did you mean 'knob'"):
        WIDGETS.build({"name": "knb"}, None, where="widget")
