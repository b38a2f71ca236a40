"""Dotted keys (`ppo.learning_rate`, `async.refresh_steps`): which exist, each value checked against
its field's type, a RunConfig built from them (then checked whole: rlfarm.config.checks), and a
config written back as the plain nested dict run files and run metadata hold.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any

from rlfarm.config.checks import parse_policy_settings, validate
from rlfarm.config.run import ALGORITHMS, PolicyConfig, RunConfig
from rlfarm.errors import ConfigError
from rlfarm.sections.algo import FIELD as _FIELD

_USER = {v: k for k, v in _FIELD.items()}  # a field as users and files spell it (async_: async)


def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their types (its ClassVars are not keys)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def valid_keys() -> list[str]:
    """Every dotted key a preset or `--set` may name."""
    keys = []
    for name, tp in _hints(RunConfig).items():
        if dataclasses.is_dataclass(tp):
            keys += [f"{_USER.get(name, name)}.{sub}" for sub in _hints(tp)]
        else:
            keys.append(name)
    return sorted(keys)


# Integer keys whose 0 means "chosen for you"; "auto" may be written for it.
AUTO_KEYS = frozenset(
    {"torch_threads", "farm.workers", "async.tasks_in_flight", "async.results_per_update", "async.max_policy_lag"}
)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type, converting only where no information is lost."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(key, v, item_tp) for v in value)
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: unsupported type {tp}")  # no optional fields by design
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value == "auto" and key in AUTO_KEYS:
            return 0
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _unknown_key(key: str) -> ConfigError:
    """One line: the key it likely is; else the keys of its section; else the sections (every key of
    every section, some 150, was a screenful after the right suggestion)."""
    keys = valid_keys()
    close = difflib.get_close_matches(key, keys, n=1)
    if close:
        return ConfigError(f"unknown config key {key!r} (did you mean {close[0]}?)")
    section = key.split(".", 1)[0] if "." in key else None
    same = [k for k in keys if section and k.startswith(f"{section}.")]
    if same:
        return ConfigError(f"unknown config key {key!r}; the keys of [{section}]: {', '.join(same)}")
    sections = sorted({k.split(".", 1)[0] for k in keys if "." in k})
    top = [k for k in keys if "." not in k]
    return ConfigError(
        f"unknown config key {key!r}; keys are section.name, with sections {', '.join(sections)}, or one of "
        f"{', '.join(top)} (every key: docs/configuration.md)"
    )


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'ppo': {'gamma': 0.9}} -> {'ppo.gamma': 0.9}"""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def from_flat(values: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Build a RunConfig from dotted keys on top of `base` (defaults if None), validating each."""
    base = base or RunConfig()
    top_hints = _hints(RunConfig)
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, _, sub = key.partition(".")
        head = _FIELD.get(head, head)
        if head not in top_hints:
            raise _unknown_key(key)
        tp = top_hints[head]
        if dataclasses.is_dataclass(tp):
            sub_hints = _hints(tp)
            if sub not in sub_hints:
                raise _unknown_key(key)
            nested.setdefault(head, {})[sub] = _coerce(key, value, sub_hints[sub])
        else:
            if sub:
                raise _unknown_key(key)
            top[head] = _coerce(key, value, tp)
    for head, changes in nested.items():
        top[head] = dataclasses.replace(getattr(base, head), **changes)
    config = dataclasses.replace(base, **top)
    validate(config)
    for name in dict.fromkeys(policy for policy, _, _ in parse_policy_settings(config.policy_settings)):
        for_policy(config, name)  # each policy's own values checked now, not when its learner is built
    return config


def _toml_value(text: str) -> Any:
    """A `policy_settings` value as TOML reads it (1e-4, true, "mse"); a bare word stays a string."""
    import tomllib

    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError("a policy_settings value nests arrays too deep; a config needs 3") from None
    return value


def for_policy(config: RunConfig, name: str) -> RunConfig:
    """The run's config as policy `name`'s learner sees it: its `policy_settings` entries applied to
    the run's algorithm section, checked as `--set` would check them."""
    values = {
        key: _toml_value(text) for policy, key, text in parse_policy_settings(config.policy_settings) if policy == name
    }
    if not values:
        return config
    try:
        own = from_flat(values, dataclasses.replace(config, policy_settings=()))
    except ConfigError as exc:
        raise ConfigError(f"policy_settings of policy {name!r}: {exc}") from None
    return dataclasses.replace(own, policy_settings=config.policy_settings)


def to_dict(config: RunConfig) -> dict[str, Any]:
    """Plain nested dict (tuples as lists): JSON- and msgpack-safe. Of the algorithms' sections only
    the run's own: the run metadata workers read then does not change when an algorithm is added, so
    a worker of an older release still reads the runs of the algorithms it knows."""

    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    return {
        _USER.get(k, k): ({sk: plain(sv) for sk, sv in v.items()} if isinstance(v, dict) else plain(v))
        for k, v in dataclasses.asdict(config).items()
        if k not in ALGORITHMS or k == config.algo
    }


def from_dict(tree: dict[str, Any]) -> RunConfig:
    """The inverse of `to_dict`, also of its JSON as `json_safe` wrote it: `target_return: null`
    (strict JSON has no Infinity) is the default, never stop early."""
    flat = flatten(tree)
    if "target_return" in flat and flat["target_return"] is None:
        del flat["target_return"]
    return from_flat(flat)


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, Infinity, -Infinity) replaced by None, recursively
    through dicts, lists and tuples: what `json.dumps(..., allow_nan=False)` accepts (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def policy_config(d: dict[str, Any]) -> PolicyConfig:
    """The [policy] section alone, e.g. from a saved policy's metadata, validated like a preset."""
    return from_flat(flatten({"policy": d})).policy
