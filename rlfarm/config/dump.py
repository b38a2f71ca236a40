"""A flat config written back as a preset TOML file (what `rlfarm train --preset PATH` reads), PURE."""

from __future__ import annotations

import json
import math
from typing import Any


def toml_value(value: Any) -> str:
    """A scalar or list as TOML: what load_preset and `--set key=value` read back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ("-inf" if value < 0 else "inf") if math.isinf(value) else "nan"
        text = repr(value)
        return text if any(c in text for c in ".eEn") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def preset_toml(flat: dict[str, Any], header: str = "") -> str:
    """`{"seed": 1, "ppo.gamma": 0.99}` as a preset: top-level keys first, then one table per section.
    `header`: comment lines put on top."""
    top = {k: v for k, v in flat.items() if "." not in k}
    tables: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if "." in key:
            section, _, sub = key.partition(".")
            tables.setdefault(section, {})[sub] = value
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{key} = {toml_value(value)}" for key, value in top.items()]
    for section, values in tables.items():
        lines += ["", f"[{section}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    return "\n".join(lines) + "\n"
