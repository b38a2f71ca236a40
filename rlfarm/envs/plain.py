"""Env state as plain values (PURE: no Redis, no Celery): numpy arrays, generators, numbers and the
containers of them as a tree rlfarm.core.codec packs without pickle (`plain`, `unplain`), and a
multi-agent game's graph of objects walked into such a tree and written back (`capture_object`,
`restore_object`). rlfarm.envs.snapshot builds a vector env's snapshot from these; AgentVector
(rlfarm.envs.agents) saves its games with them.
"""

from __future__ import annotations

import types
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.errors import Unsnapshotable

# The bit generators a snapshot may name, each numpy's own class: a blob named a function of
# np.random (np.random.test() ran numpy's test suite on a worker).
BIT_GENERATORS = {
    cls.__name__: cls
    for cls in (np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937, np.random.Philox, np.random.SFC64)
}


def is_configuration(value: Any) -> bool:
    return (
        isinstance(value, (gym.spaces.Space, gym.envs.registration.EnvSpec))
        or callable(value)
        and not isinstance(value, np.random.Generator)
    )


# ---- plain values --------------------------------------------------------------------------------
# Tagged where msgpack would lose the type: tuples and deques would come back as lists, numpy scalars
# as Python numbers (which promote differently), generators are objects.


def plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, np.generic):
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            return {"~": "bigint", "v": str(value)}
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise Unsnapshotable(f"an array of {value.dtype}")
        return np.array(value, copy=True)
    if isinstance(value, np.generic):
        return {"~": "scalar", "v": np.asarray(value)}
    if isinstance(value, np.random.Generator):
        return {"~": "generator", "v": plain(value.bit_generator.state)}
    if isinstance(value, np.random.RandomState):
        name, keys, pos, has_gauss, gauss = value.get_state()
        return {"~": "randomstate", "v": [name, np.array(keys), pos, has_gauss, gauss]}
    if isinstance(value, deque):
        return {"~": "deque", "v": [plain(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, tuple):
        return {"~": "tuple", "v": [plain(v) for v in value]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {"~": "dict", "v": [[plain(k), plain(v)] for k, v in value.items()]}
    raise Unsnapshotable(f"a {type(value).__module__}.{type(value).__qualname__}")


def unplain(value: Any, current: Any = None) -> Any:
    """The value `plain` made `value` from; written into `current` where that keeps references
    valid (arrays of the same shape and dtype, generators, deques), then `current` is returned."""
    if isinstance(value, np.ndarray):
        if (
            isinstance(current, np.ndarray)
            and current.shape == value.shape
            and current.dtype == value.dtype
            and current.flags.writeable
        ):
            np.copyto(current, value)
            return current
        return np.array(value, copy=True)
    if isinstance(value, list):
        return [unplain(v) for v in value]
    if not isinstance(value, dict) or "~" not in value:
        return value
    tag, inner = value["~"], value["v"]
    if tag == "bigint":
        return int(inner)
    if tag == "scalar":
        return np.asarray(inner)[()]
    if tag == "generator":
        state = unplain(inner)
        if isinstance(current, np.random.Generator) and type(current.bit_generator).__name__ == state["bit_generator"]:
            current.bit_generator.state = state
            return current
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if name not in BIT_GENERATORS:  # a name from the blob: never any other attribute of np.random
            raise ValueError(f"a snapshot names bit generator {str(name)[:40]!r}, not one of numpy's")
        bit_generator = BIT_GENERATORS[name]()
        bit_generator.state = state
        return np.random.Generator(bit_generator)
    if tag == "randomstate":
        name, keys, pos, has_gauss, gauss = inner
        target = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        target.set_state((name, np.array(keys, np.uint32), pos, has_gauss, gauss))
        return target
    if tag == "deque":
        items = [unplain(v) for v in inner]
        if isinstance(current, deque) and current.maxlen == value["maxlen"]:
            current.clear()
            current.extend(items)
            return current
        return deque(items, maxlen=value["maxlen"])
    if tag == "tuple":
        return tuple(unplain(v) for v in inner)
    if tag == "dict":
        return {unplain(k): unplain(v) for k, v in inner}
    raise ValueError(f"unknown snapshot value tag {tag!r:.40}")


# ---- object graphs (PettingZoo's games) -----------------------------------------------------------
# Rendering state a game holds even when it renders nothing (mpe2's pygame screen and font): skipped.
_RENDERING = ("pygame",)
# Configuration by name; unlike a gymnasium wrapper chain's layers, a wrapped game's `env` is walked.
_OBJECT_SKIP_NAMES = frozenset({"metadata", "spec", "render_mode", "_ezpickle_args", "_ezpickle_kwargs"})


def _is_object(value: Any) -> bool:
    return hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, np.ndarray))


def capture_object(obj: Any) -> dict[str, Any]:
    """`obj`'s state as a tree of plain values: its attributes, and those of the objects they hold."""
    return _state(obj, {})


def restore_object(obj: Any, state: dict[str, Any]) -> None:
    """Write `state` (`capture_object` of an object made like `obj`) back into `obj`'s objects."""
    _restored(state, obj, {})


# Objects and mutable containers are numbered as met; one met again is saved as a reference to its
# number, so a restored game shares what the saved one shared (mpe2's agent selector holds the game's
# list of agents as it was at the reset before last: the same list object until the next reset).
_KEPT = {"~": "kept"}  # configuration or rendering: left as the object made anew has it


def _kind(value: Any) -> str | None:
    """What of `value` is numbered (`_state`): mutable containers, arrays and objects; None: a value."""
    for cls, name in ((np.ndarray, "array"), (list, "list"), (dict, "dict"), (deque, "deque")):
        if isinstance(value, cls):
            return name
    return "object" if _is_object(value) else None


def _state(value: Any, memo: dict[int, int]) -> Any:
    if is_configuration(value) or type(value).__module__.split(".")[0] in _RENDERING:
        return _KEPT
    if isinstance(value, tuple):
        return {"~": "tuple", "v": [_state(v, memo) for v in value]}
    kind = _kind(value)
    if kind is None:
        return plain(value)
    if id(value) in memo:
        return {"~": "ref", "n": memo[id(value)]}
    n = memo[id(value)] = len(memo)
    if kind == "array":  # (an array two objects hold is one array again when restored)
        return {"~": "array", "n": n, "v": plain(value)}
    if kind == "list":
        return {"~": "list", "n": n, "v": [_state(v, memo) for v in value]}
    if kind == "deque":
        return {"~": "deque", "n": n, "v": [_state(v, memo) for v in value], "maxlen": value.maxlen}
    if kind == "dict":
        return {"~": "dict", "n": n, "v": [[plain(k), _state(v, memo)] for k, v in value.items()]}
    attrs = {}
    for name, attr in vars(value).items():
        if name in _OBJECT_SKIP_NAMES:
            continue
        try:
            state = _state(attr, memo)
        except Unsnapshotable as exc:
            raise Unsnapshotable(f"{type(value).__name__}.{name} holds {exc}") from None
        if state is not _KEPT:
            attrs[name] = state
    return {"~": "object", "n": n, "class": type(value).__qualname__, "attrs": attrs}


def _is_behaviour(obj: Any, name: str) -> bool:
    """Whether `name` is one of `obj`'s methods, properties or configuration, which a value written
    into its __dict__ would replace."""
    if name not in vars(obj) and isinstance(getattr(type(obj), name, None), property):
        return True
    return is_configuration(getattr(obj, name, None))


def _restored(value: Any, current: Any, made: dict[int, Any]) -> Any:
    """`_state`'s `value` made anew, objects written back into `current` (the live one at the same
    place: objects cannot be made from a snapshot); `made`: what each number was restored as."""
    if not isinstance(value, dict) or "~" not in value:
        return unplain(value)
    tag = value["~"]
    if tag == "kept":
        return current
    if tag == "ref":
        return made[value["n"]]
    if tag == "array":
        made[value["n"]] = unplain(value["v"])
        return made[value["n"]]
    if tag == "tuple":
        olds = list(current) if isinstance(current, tuple) and len(current) == len(value["v"]) else []
        return tuple(_restored(v, olds[i] if olds else None, made) for i, v in enumerate(value["v"]))
    if tag == "list":
        olds = current if isinstance(current, list) and len(current) == len(value["v"]) else []
        out: list[Any] = []
        made[value["n"]] = out
        out.extend(_restored(v, olds[i] if olds else None, made) for i, v in enumerate(value["v"]))
        return out
    if tag == "deque":
        queue: deque[Any] = deque(maxlen=value["maxlen"])
        made[value["n"]] = queue
        queue.extend(_restored(v, None, made) for v in value["v"])
        return queue
    if tag == "dict":
        table: dict[Any, Any] = {}
        made[value["n"]] = table
        for k, v in value["v"]:
            key = unplain(k)
            table[key] = _restored(v, current.get(key) if isinstance(current, dict) else None, made)
        return table
    if tag == "object":
        if type(current).__qualname__ != value["class"]:
            raise ValueError(f"env snapshot of a {value['class']}, not of a {type(current).__qualname__}")
        made[value["n"]] = current
        attrs = vars(current)
        for name, state in value["attrs"].items():
            if not isinstance(name, str) or name in _OBJECT_SKIP_NAMES or _is_behaviour(current, name):
                raise ValueError(f"env snapshot sets {value['class']}.{str(name)[:40]}, which is configuration")
            attrs[name] = _restored(state, attrs.get(name), made)
        return current
    return unplain(value, current)
