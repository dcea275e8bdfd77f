"""The one selector rule: ``--where KEY=VALUE[,VALUE]`` on the command line and ``where:`` in a recipe's tables.

A selector is {dotted key: [wanted values]}. A configuration matches when the value at every key (a flattened
key such as ``method.name``, or the dotted path into nested sections; ``seed`` included) is one of the wanted
values, compared as ``config.value_text`` spells them (100 and 100.0 are one value). A key the configuration
does not have matches no value: an option that a run's plugin lacks never selects that run.

``--where`` narrows a recipe's grid before its runs are validated (recipe._expand): a run it leaves out is
never checked, so it cannot block a launch. Imports neither torch nor the plugins.
"""

from __future__ import annotations

import yaml

from ltbench.config import value_text
from ltbench.errors import ConfigError

ABSENT = object()
EXAMPLE = "--where data.imb_factor=10,100"


def parse_where(items: list[str] | None) -> dict[str, list]:
    """``--where`` options as {dotted key: [values]} (values read as YAML scalars: 100, 0.1, true, ce); a key
    given twice takes the values of both."""
    out: dict[str, list] = {}
    for item in items or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ConfigError(f"--where {item}: expected KEY=VALUE[,VALUE] (e.g. {EXAMPLE})")
        out.setdefault(key, []).extend(_scalar(v.strip(), key) for v in values.split(","))
    return out


def _scalar(text: str, key: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"--where {key}={text}: not a YAML value; expected e.g. 10, 0.1, true or ce") from None


def where_tokens(where: dict[str, list]) -> list[str]:  # as text: names a narrowed expansion in the caches
    return [f"--where {k}={','.join(value_text(v) for v in values)}" for k, values in where.items()]


def value_at(config: dict, key: str) -> object:
    """The value at a dotted key of a configuration (a flattened one too), or ABSENT."""
    if key in config:
        return config[key]
    node: object = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def matches(config: dict, selector: dict[str, list], absent: bool | None = False) -> bool | None:
    """The rule (module docstring). ``absent``: what a missing key gives unless another key mismatches: False
    in a run's full configuration, None (undecided) in a declared one, before the plugins' defaults."""
    values = [value_at(config, key) for key in selector]
    if any(v is not ABSENT and value_text(v) not in {value_text(w) for w in wanted}
           for v, wanted in zip(values, selector.values())):
        return False
    return absent if ABSENT in values else True


def select_where(configs: list[dict], where: dict[str, list]) -> list[bool]:
    """Which configurations ``where`` keeps. A key that no configuration has, or a selection that keeps none,
    is refused naming the values the runs have: what the user typed takes effect or is refused."""
    for key, wanted in where.items():
        have = sorted({value_text(v) for v in (value_at(c, key) for c in configs) if v is not ABSENT})
        if not have:
            raise ConfigError(f"--where {key}: no run of this recipe has this key; a key is a dotted path into a "
                              f"run's configuration (method.name, data.imb_factor, optim.lr, seed)")
        if not {value_text(v) for v in wanted} & set(have):
            raise ConfigError(f"--where {key}={','.join(value_text(v) for v in wanted)}: no run has this value; "
                              f"the runs have {key} = {', '.join(have[:20])}")
    keep = [bool(matches(c, where)) for c in configs]
    if where and not any(keep):
        raise ConfigError(f"{' '.join(where_tokens(where))}: no run has all of these values at once")
    return keep
