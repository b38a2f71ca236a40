"""Presets (TOML files whose tables mirror RunConfig's sections: `[env]`, `[farm]`, `[policy]`,
`[ppo]`), `--set key=value` overrides, and `build`: a preset, then overrides, then explicit options.
Reads only preset files.
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from rlfarm.config.keys import flatten, from_flat
from rlfarm.config.run import RunConfig
from rlfarm.errors import ConfigError

# How deep a preset's tables and a value's arrays may nest: a config nests 3 levels (a section, a
# list of lists); 5,000 nested tables or 3,000 nested arrays overflowed Python's stack in a traceback.
MAX_NESTING = 16


def nesting(value: Any) -> int:
    """How many tables and arrays deep `value` goes (0 for a scalar), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_NESTING:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def read_toml(text: str, what: str) -> dict[str, Any]:
    """TOML text as a dict, refused in one line when it nests deeper than a config can."""
    try:
        tree = tomllib.loads(text)
    except RecursionError:
        tree = None
    if tree is None or nesting(tree) > MAX_NESTING:
        raise ConfigError(f"{what} nests tables or arrays more than {MAX_NESTING} deep; a config needs 3")
    return tree


def _preset_dir() -> Path:
    return Path(str(resources.files("rlfarm.config") / "presets"))


def preset_names() -> list[str]:
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by shipped name or by path to a TOML file, as a flat dict of dotted keys."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        path = _preset_dir() / f"{name_or_path}.toml"
        if not path.exists():
            names = preset_names()
            close = difflib.get_close_matches(name_or_path, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown preset {name_or_path!r}{hint}; available: {', '.join(names)}")
    try:
        tree = read_toml(path.read_text(), f"preset {path}")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"preset {path}: invalid TOML: {exc}") from None
    return flatten(tree)


def parse_override(text: str) -> tuple[str, Any]:
    """'ppo.gamma=0.9' -> ('ppo.gamma', 0.9). Values are read as TOML, falling back to a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    raw = raw.strip()
    try:
        value = read_toml(f"v = {raw}", f"the value of override {key}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def build(preset: str | None = None, overrides: list[str] | tuple[str, ...] = (), **explicit: Any) -> RunConfig:
    """Preset, then `--set` overrides, then explicit CLI options (None values are skipped)."""
    values: dict[str, Any] = load_preset(preset) if preset else {}
    for text in overrides:
        key, value = parse_override(text)
        values[key] = value
    for key, value in explicit.items():
        if value is not None:
            values[key] = value
    return from_flat(values)


def preset_description(name: str) -> str:
    return str(load_preset(name).get("description", ""))
