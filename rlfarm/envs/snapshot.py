"""The complete state of a vector env, saved and restored: what lets an env stream ("continue"
episodes) move from one worker process to another and go on bit for bit (PURE: no Redis, no Celery).

A snapshot is a tree of plain values (numpy arrays, bytes, str, int, float, bool, None, lists and
maps) that rlfarm.core.codec packs without pickle. Three kinds of env state are understood:

- a vector env with `snapshot()` / `restore(state)` methods of its own (rlfarm.envs.ale_vector.AleVector:
  the emulators' states with their RNGs, frame stacks, max-pool buffers);
- gymnasium's `SyncVectorEnv`, one sub-env at a time, each walked from its outermost wrapper to the
  env itself. Each layer's attributes are saved when they are plain values (arrays, numbers, numpy
  generators, lists, tuples, deques and maps of them: classic control, TimeLimit's step count, a frame
  stack's queue); spaces, specs and callables are configuration and skipped. A MuJoCo env adds its
  `MjData` (every array field: the integration state and the quantities derived from it, which some
  envs read before their next step). An env of your own may define `rlfarm_snapshot()` returning such
  a tree and `rlfarm_restore(state)`;
- a multi-agent env (rlfarm.envs.agents.AgentVector) saves its own arrays and each game's PettingZoo
  env as an object graph (`capture_object`): every object's attributes, walked from the env through
  its wrappers, world, agents and their states, as plain values; rendering state (pygame) and
  configuration are skipped, and an object met twice is saved once;
- anything else (an attribute holding an object that is not understood) cannot be saved: `capture`
  raises `Unsnapshotable` naming the attribute, and a run refuses `farm.episodes = "continue"` on it
  before it starts.

Restoring writes arrays back into the arrays already there where shapes agree (other objects may
hold references to a buffer: AtariPreprocessing's max-pool buffers are read by reference) and sets
generators' states in place.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv

from rlfarm.envs.plain import is_configuration, plain, unplain
from rlfarm.errors import Unsnapshotable

FORMAT = 1  # the layout of a snapshot tree; a worker refuses another


# Attribute names that are configuration or rendering, never state, whatever their value.
_SKIP_NAMES = frozenset(
    {
        "env",
        "metadata",
        "spec",
        "_cached_spec",
        "render_mode",
        "_np_random_seed",
        "mujoco_renderer",
        "model",
        "data",
        "_ezpickle_args",
        "_ezpickle_kwargs",
    }
)


def capture(envs: Any) -> dict[str, Any]:
    """The complete state of `envs` (a vector env) as a tree of plain values."""
    if callable(getattr(envs, "snapshot", None)) and callable(getattr(envs, "restore", None)):
        return {"format": FORMAT, "kind": type(envs).__name__, "state": envs.snapshot()}
    if isinstance(envs, SyncVectorEnv):
        return {"format": FORMAT, "kind": "SyncVectorEnv", "envs": [_capture_env(e) for e in envs.envs]}
    raise Unsnapshotable(f"a {type(envs).__name__} cannot be saved and restored")


def restore(envs: Any, snapshot: dict[str, Any], config: Configuration | None = None) -> None:
    """Put `envs` (made like those captured) into the captured state. `config`: what a probe of the env
    showed (`configuration`): a snapshot that holds an attribute the env never had, or gives its
    configuration another value, is refused (ValueError) before anything is written."""
    if snapshot.get("format") != FORMAT:
        raise ValueError(f"env snapshot of format {snapshot.get('format')!r}, this worker reads {FORMAT}")
    kind = snapshot.get("kind")
    if kind != ("SyncVectorEnv" if isinstance(envs, SyncVectorEnv) else type(envs).__name__):
        raise ValueError(f"env snapshot of a {kind!r}, not of a {type(envs).__name__}")
    if config is not None:
        config.check(snapshot)
    if kind != "SyncVectorEnv":
        envs.restore(snapshot["state"])
        return
    if len(snapshot["envs"]) != len(envs.envs):
        raise ValueError(f"env snapshot of {len(snapshot['envs'])} sub-envs, not {len(envs.envs)}")
    for env, state in zip(envs.envs, snapshot["envs"]):
        _restore_env(env, state)


def _layers(env: Any) -> list[Any]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _capture_env(env: Any) -> list[dict[str, Any]]:
    return [_capture_layer(layer) for layer in _layers(env)]


def _restore_env(env: Any, states: list[dict[str, Any]]) -> None:
    layers = _layers(env)
    if len(layers) != len(states) or any(type(layer).__name__ != s["class"] for layer, s in zip(layers, states)):
        raise ValueError(
            "env snapshot of another wrapper chain: "
            f"{[s['class'] for s in states]} vs {[type(layer).__name__ for layer in layers]}"
        )
    for layer, state in zip(layers, states):
        _restore_layer(layer, state)


def _is_mujoco(layer: Any) -> bool:
    module = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")  # not imported: no layer can be one
    return module is not None and isinstance(layer, module.MujocoEnv)


def _capture_layer(layer: Any) -> dict[str, Any]:
    name = type(layer).__name__
    if callable(getattr(layer, "rlfarm_snapshot", None)):
        return {"class": name, "own": layer.rlfarm_snapshot()}
    out: dict[str, Any] = {"class": name, "attrs": {}}
    for attr, value in vars(layer).items():
        if attr in _SKIP_NAMES or is_configuration(value):
            continue
        try:
            out["attrs"][attr] = plain(value)
        except Unsnapshotable as exc:
            raise Unsnapshotable(
                f"{name}.{attr} holds {exc}, whose state rlfarm cannot save; give "
                f"{name} rlfarm_snapshot() and rlfarm_restore(state) methods, or use "
                f'farm.episodes = "fresh"'
            ) from None
    if _is_mujoco(layer):
        out["mjdata"] = _capture_mjdata(layer.data)
    return out


def _restore_layer(layer: Any, state: dict[str, Any]) -> None:
    if "own" in state:
        layer.rlfarm_restore(state["own"])
        return
    for attr, value in state["attrs"].items():
        # Only what `_capture_layer` saves: never configuration, a method or a property (an attribute
        # of a fresh env's its reset makes, as Pendulum's `state`, is not there yet: `known` has it).
        if not isinstance(attr, str) or attr in _SKIP_NAMES:
            raise ValueError(f"env snapshot sets {type(layer).__name__}.{str(attr)[:40]}, which is configuration")
        if is_configuration(getattr(layer, attr, None)) or isinstance(getattr(type(layer), attr, None), property):
            raise ValueError(f"env snapshot sets {type(layer).__name__}.{attr}, which is configuration")
        current = vars(layer).get(attr)
        restored = unplain(value, current)
        if restored is not current:
            setattr(layer, attr, restored)
    if "mjdata" in state:
        if not _is_mujoco(layer):
            raise ValueError(f"env snapshot holds MuJoCo data, {type(layer).__name__} is no MuJoCo env")
        _restore_mjdata(layer.model, layer.data, state["mjdata"])


# ---- configuration: what a snapshot never sets ------------------------------------------------------
# A snapshot holds an env's state, but saved as plain values it also holds values the env was made
# with and never changes (CartPole's thresholds, TimeLimit's _max_episode_steps): a blob that set
# them would change the env under a run (CartPole ending at x = 1e9). Which is which is learned by
# watching the env, as no list per env family could keep up with user envs: a probe of one sub-env
# (or game) is reset and stepped with random actions through its first episodes; a value that never
# changed is configuration, and a snapshot must hold it as the probe did.
Path = tuple[Any, ...]
_EACH = "*"  # a sub-env's or game's place in a path: configuration is the same for each


def _leaves(tree: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """The plain values (numbers, strings, arrays) of a snapshot tree, each with its path. Generators
    are left out: one used only at a reset keeps its state through a long episode, yet is state."""
    if isinstance(tree, dict):
        tag = tree.get("~")
        if tag in ("generator", "randomstate", "ref", "kept"):
            return
        if tag in ("scalar", "bigint"):
            yield path, tree
            return
        for key, value in tree.items():
            if key not in ("~", "n", "maxlen"):
                yield from _leaves(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _leaves(value, (*path, i))
    else:
        yield path, tree


def _units(tree: Any) -> dict[Path, list[tuple[Path, Any]]]:
    """A snapshot tree's values grouped by the attribute that holds them (the path up to the last
    attribute name in it): configuration is an attribute's whole value (a board's empty top row is
    not), and a sub-env's or game's only, since the vector's own arrays are sized by its count."""
    units: dict[Path, list[tuple[Path, Any]]] = {}
    for path, value in _leaves(tree):
        if _EACH not in _normal(path) or "mjdata" in path:  # MuJoCo's data: the physics' state, contacts and all
            continue
        cut = max((i + 2 for i, key in enumerate(path[:-1]) if key == "attrs"), default=len(path))
        units.setdefault(path[:cut], []).append((path[cut:], value))
    return units


def _normal(path: Path) -> Path:
    """`path` with its sub-env's or game's index as _EACH: configuration is the same for each."""
    for head in (("envs",), ("state", "games")):
        if path[: len(head)] == head and len(path) > len(head):
            return (*head, _EACH, *path[len(head) + 1 :])
    return path


def _same_unit(a: list[tuple[Path, Any]], b: list[tuple[Path, Any]]) -> bool:
    return len(a) == len(b) and all(pa == pb and _same(va, vb) for (pa, va), (pb, vb) in zip(a, b))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and a != a and b != b)


def _shape(path: Path) -> Path:
    """An attribute's place whatever the index of each list on the way (a list of agents may grow)."""
    return tuple("#" if isinstance(key, int) else key for key in path)


@dataclass
class Configuration:
    """What a probe of an env showed (`configuration`): `fixed`, the attributes that kept their value
    (by path, a sub-env's or game's index as _EACH), and `known`, every attribute it had (`_shape`)."""

    fixed: dict[Path, list[tuple[Path, Any]]] = field(default_factory=dict)
    known: set[Path] = field(default_factory=set)

    def check(self, snapshot: dict[str, Any]) -> None:
        """ValueError, naming it, for the first attribute of `snapshot` the env never had or that
        holds another value of its configuration."""
        for path, unit in _units(snapshot).items():
            normal = _normal(path)
            if self.known and _shape(normal) not in self.known:
                raise ValueError(f"env snapshot sets {_name(snapshot, path)}, which the env has not")
            if normal in self.fixed and not _same_unit(unit, self.fixed[normal]):
                raise ValueError(f"env snapshot sets {_name(snapshot, path)}, which is the env's configuration")


def configuration(envs: Any, seed: int = 0, episodes: int = 2, max_steps: int = 2000) -> Configuration:
    """What of `capture(envs)` is configuration: the attributes that kept their value from the first
    reset through `episodes` episodes of random actions (at most `max_steps` steps), and which
    attributes the env has at all. `envs`: a probe made like the stream's envs, with one sub-env (or
    game); it is stepped. An env that saves its own state (AleVector, `rlfarm_snapshot`) answers for
    it: nothing is learned of it."""
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    first = capture(envs)
    if "envs" not in first and "games" not in first.get("state", {}):
        return Configuration()
    fixed = {_normal(path): unit for path, unit in _units(first).items()}
    known = {_shape(path) for path in fixed}
    ended = 0
    for _ in range(max_steps):
        _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        ended += int(np.any(terminated) or np.any(truncated))
        now = {_normal(path): unit for path, unit in _units(capture(envs)).items()}
        known.update(_shape(path) for path in now)
        fixed = {path: unit for path, unit in fixed.items() if path in now and _same_unit(unit, now[path])}
        if ended >= episodes:
            break
    return Configuration(fixed, known)


def _name(snapshot: dict[str, Any], path: Path) -> str:
    """`CartPoleEnv.x_threshold` for the path of an attribute of a wrapper layer or object."""
    node: Any = snapshot
    owner = None
    for key in path:
        if isinstance(node, dict) and "class" in node:
            owner = node["class"]
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
    attr = next((path[i + 1] for i in range(len(path) - 1, -1, -1) if path[i] == "attrs" and i + 1 < len(path)), None)
    return f"{owner}.{attr}" if owner and attr is not None else "/".join(map(str, path))[:120]


# ---- MuJoCo --------------------------------------------------------------------------------------
# mj_getState's integration state is what mj_step needs; but envs also read quantities mj_step
# derived on its way (Ant-v5 takes its position before a step from `xpos`, which lags qpos by the last
# substep), so every array field of MjData is kept: a few KB for the locomotion tasks. Fields sized by
# the step's contacts and constraints (efc_*, contact) are recomputed by the next mj_step before
# anything reads them; where their size differs from the snapshot's they are left as they are.


def _mjdata_fields(data: Any) -> list[str]:
    return sorted(
        name for name in dir(data) if not name.startswith("_") and isinstance(getattr(data, name, None), np.ndarray)
    )


def _capture_mjdata(data: Any) -> dict[str, Any]:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(data.model, spec), np.float64)
    mujoco.mj_getState(data.model, data, state, spec)
    return {"integration": state, "arrays": {name: np.array(getattr(data, name)) for name in _mjdata_fields(data)}}


def _restore_mjdata(model: Any, data: Any, saved: dict[str, Any]) -> None:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.asarray(saved["integration"], np.float64)
    if state.shape != (mujoco.mj_stateSize(model, spec),):
        raise ValueError("MuJoCo snapshot of another model")
    for name, value in saved["arrays"].items():
        target = getattr(data, name, None)
        if isinstance(target, np.ndarray) and target.shape == value.shape and target.flags.writeable:
            np.copyto(target, value)
    mujoco.mj_setState(model, data, state, spec)


def check(env_id: str, options: dict[str, Any] | None = None, agents: int = 1) -> None:
    """Before a "continue" run starts: the env's state can be saved (`Unsnapshotable`, one line, if
    not). Makes a one-env vector of it as workers would (one game of `agents` agents), steps it once,
    and captures it."""
    from rlfarm.envs.make import make_vector_env

    envs = make_vector_env(env_id, max(1, agents), options=options)  # one game: a sub-env per agent
    try:
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        capture(envs)
    except Unsnapshotable as exc:
        raise Unsnapshotable(
            f'farm.episodes = "continue" needs env state rlfarm can save and restore, '
            f"so that any worker process can go on with a run's env stream: {exc}"
        ) from None
    finally:
        envs.close()
