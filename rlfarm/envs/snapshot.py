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
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv

from rlfarm.envs.state import Unsnapshotable, is_configuration, plain, unplain

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


def restore(envs: Any, snapshot: dict[str, Any]) -> None:
    """Put `envs` (made like those captured) into the captured state."""
    if snapshot.get("format") != FORMAT:
        raise ValueError(f"env snapshot of format {snapshot.get('format')!r}, this worker reads {FORMAT}")
    kind = snapshot.get("kind")
    if kind != ("SyncVectorEnv" if isinstance(envs, SyncVectorEnv) else type(envs).__name__):
        raise ValueError(f"env snapshot of a {kind!r}, not of a {type(envs).__name__}")
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
        current = vars(layer).get(attr)
        restored = unplain(value, current)
        if restored is not current:
            setattr(layer, attr, restored)
    if "mjdata" in state:
        if not _is_mujoco(layer):
            raise ValueError(f"env snapshot holds MuJoCo data, {type(layer).__name__} is no MuJoCo env")
        _restore_mjdata(layer.model, layer.data, state["mjdata"])


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
