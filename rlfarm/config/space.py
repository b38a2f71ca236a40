"""A sweep's search space (`rlfarm sweep --space space.toml`), PURE: parsed, checked against a run's
config before anything starts, and turned into `--set key=value` overrides for a trial.

    [space]
    "ppo.learning_rate" = { low = 1e-4, high = 1e-2, log = true }   # float (log-uniform)
    "ppo.update_epochs" = { choices = [4, 10] }                       # categorical
    "farm.num_tasks" = { low = 2, high = 8, step = 2 }               # int: low and high are ints

Sampling goes through any object with Optuna's `suggest_float / suggest_int / suggest_categorical`
(an optuna Trial); this module imports no Optuna.

The space is also the authority over what a sweep trains and writes (docs/architecture.md, decision
23): a trial's params read back from the study are data that anyone who can write to the farm's Redis
may have put there, so `check_params` holds them against the space before a trial trains or becomes
best.toml.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfarm.config.dump import toml_value
from rlfarm.config.keys import from_flat
from rlfarm.errors import ConfigError

_FIELDS = {"low", "high", "log", "step", "choices"}


@dataclass(frozen=True)
class Param:
    """One dimension of the space: a range (`low`..`high`, ints when both are ints) or `choices`."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def is_int(self) -> bool:
        return not self.choices and isinstance(self.low, int) and isinstance(self.high, int)

    def suggest(self, trial: Any) -> Any:
        if self.choices:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        """Whether `value` is a point of this dimension: one of the choices (same kind: True is not 1),
        or a number of the range's kind within its bounds and on its step."""
        if self.choices:
            return any(_same(value, choice) for choice in self.choices)
        if not _number(value) or not self.low <= value <= self.high:
            return False
        if self.is_int:
            return isinstance(value, int) and (value - self.low) % (self.step or 1) == 0
        if self.step:  # Optuna's grid: low + k * step, k an integer up to float rounding
            k = (value - self.low) / self.step
            return abs(k - round(k)) <= 1e-6
        return True

    def describe(self) -> str:
        if self.choices:
            return f"one of {list(self.choices)}"
        kind = "int" if self.is_int else "float"
        return (
            f"{kind} in [{self.low}, {self.high}]"
            + (" log" if self.log else "")
            + (f" step {self.step}" if self.step else "")
        )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _same(value: Any, choice: Any) -> bool:
    """Equal and of the same kind: Python's True == 1 and "1" != 1 aside, a bool is no number here."""
    kinds = (isinstance(value, bool), isinstance(value, str), isinstance(choice, bool), isinstance(choice, str))
    return kinds[:2] == kinds[2:] and value == choice


def _show(value: Any) -> str:
    """A value as TOML where it can be, cut short: a forged value may be anything, of any length."""
    try:
        text = toml_value(value)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_param(key: str, spec: Any) -> Param:
    """One `[space]` entry, its shape checked (not yet against a config): ConfigError names the key."""
    where = f"space key {key!r}"
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: expected a table like {{ low = 1e-4, high = 1e-2 }} or {{ choices = [4, 10] }}, got {spec!r}"
        )
    unknown = sorted(set(spec) - _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (fields: low, high, log, step, choices)")
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) - {"choices"}:
            raise ConfigError(f"{where}: give either choices or low/high, not both")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
        if not all(isinstance(c, bool | int | float | str) for c in choices):
            raise ConfigError(f"{where}: choices must be numbers, strings or booleans, got {choices!r}")
        return Param(key, choices=tuple(choices))
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{where}: a range needs both low and high (or give choices)")
    low, high, step, log = spec["low"], spec["high"], spec.get("step"), spec.get("log", False)
    if not (_number(low) and _number(high)):
        raise ConfigError(f"{where}: low and high must be numbers, got {low!r} and {high!r}")
    if not low < high:
        raise ConfigError(f"{where}: bad range: low ({low}) must be below high ({high})")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{where}: bad range: a log range needs low > 0, got {low}")
    if step is not None:
        if not _number(step) or step <= 0:
            raise ConfigError(f"{where}: step must be a positive number, got {step!r}")
        if log:
            raise ConfigError(f"{where}: step and log cannot be combined")
        if isinstance(low, int) and isinstance(high, int) and not isinstance(step, int):
            raise ConfigError(f"{where}: an int range (int low and high) needs an int step, got {step!r}")
    return Param(key, low=low, high=high, log=log, step=step)


def parse_space(tree: dict[str, Any], base: dict[str, Any]) -> list[Param]:
    """The `[space]` table of a space file, each key checked against the run's config: `base` is the
    flat config the trials start from (preset and overrides); every bound and choice must make a
    valid config with it, so an unknown key or a value out of the key's range fails here."""
    space = tree.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(
            "the space file needs a non-empty [space] table, e.g. "
            '"ppo.learning_rate" = { low = 1e-4, high = 1e-2, log = true }'
        )
    extra = sorted(set(tree) - {"space"})
    if extra:
        raise ConfigError(f"unknown table or key {extra[0]!r} in the space file (only [space])")
    params = [parse_param(key, spec) for key, spec in space.items()]
    for param in params:
        for value in param.choices or (param.low, param.high):
            try:
                from_flat({**base, param.key: value})
            except ConfigError as exc:
                raise ConfigError(f"space key {param.key!r}: {exc}") from None
    return params


def load_space(path: str | Path, base: dict[str, Any]) -> list[Param]:
    """parse_space of a TOML file; a missing or unreadable file is a ConfigError naming it."""
    path = Path(path)
    try:
        tree = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no space file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the space file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"space file {path}: invalid TOML: {exc}") from None
    return parse_space(tree, base)


def check_params(params: dict[str, Any], space: list[Param]) -> str | None:
    """None when `params` (a trial's, read back from the study) is a point of `space`: exactly its keys,
    each value within its dimension; else the first problem, in one line naming the key and value."""
    dims = {param.key: param for param in space}
    for key, value in params.items():
        shown = key if isinstance(key, str) and key.isprintable() and len(key) <= 80 else _show(key)
        if key not in dims:
            return f"{shown} = {_show(value)} is not in the space (no such key in it)"
        if not dims[key].contains(value):
            return f"{shown} = {_show(value)} is not in the space ({dims[key].describe()})"
    missing = [key for key in dims if key not in params]
    if missing:
        return f"{missing[0]} has no value, but it is in the space"
    return None


def sample(params: list[Param], trial: Any) -> dict[str, Any]:
    """{key: value} of one trial."""
    return {param.key: param.suggest(trial) for param in params}


def to_overrides(values: dict[str, Any]) -> list[str]:
    """['ppo.learning_rate=0.00123', ...]: what `rlfarm train --set` takes (values as TOML)."""
    return [f"{key}={toml_value(value)}" for key, value in values.items()]
