"""Making envs: gymnasium ids or "module:callable", one env or a vector of them, with the run's
preprocessing (DeepMind's for Atari ids, rlfarm.envs.atari).

Env ids that come from Redis or from a file (a worker building a run's env, `rlfarm eval` of a
policy that names its env) are untrusted: `make_env(..., trusted=False)` checks them against the
allowlist (rlfarm.envs.allowlist) before anything is imported. The trainer builds the env the user
typed: trusted.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfarm.envs.agents import AgentVector, is_multiagent, pettingzoo_factory, to_parallel
from rlfarm.envs.allowlist import ALLOWED_MODULES_VAR, check_env_allowed, module_allowed
from rlfarm.envs.turns import TurnVector, is_turn_based
from rlfarm.errors import EnvError

# Characters of an env id (rlfarm.sections.bounds refuses longer ones in a config; this module sees ids
# from Redis too, and never imports the config).
MAX_ENV_ID_CHARS = 256


def _factory(env_id: str, trusted: bool = True) -> Callable[..., gym.Env]:
    """A constructor for `env_id`. `trusted=False` (an id read from Redis or a file): allowlist first
    (check_env_allowed), and never a "module:..." string to gym.make, which would import the module."""
    if len(env_id) > MAX_ENV_ID_CHARS:  # an id read from Redis too: never echoed whole
        raise EnvError(f"an env id of {len(env_id):,} characters, above its bound of {MAX_ENV_ID_CHARS}")
    if _is_atari_id(env_id) and env_id not in gym.registry:
        from rlfarm.envs import atari

        atari.register()  # ale_py, a fixed module: registers the ALE ids (or says how to install it)
    pettingzoo = pettingzoo_factory(env_id)
    if pettingzoo is not None:
        return pettingzoo
    if not trusted:
        check_env_allowed(env_id)
        if env_id in gym.registry:
            spec = gym.registry[env_id]  # the spec, not the id: no import of an id's "module:" part
            return lambda **kwargs: gym.make(spec, **kwargs)
    if env_id in gym.registry:
        return lambda **kwargs: gym.make(env_id, **kwargs)
    if ":" in env_id:
        module_name, _, attr = env_id.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EnvError(f"env {env_id!r}: cannot import module {module_name!r}: {exc}") from None
        if env_id in gym.registry:  # importing the module may have registered it
            return lambda **kwargs: gym.make(env_id, **kwargs)
        target = getattr(module, attr, None)
        if target is None:
            raise EnvError(f"env {env_id!r}: module {module_name!r} has no attribute {attr!r}")
        if not trusted:  # only the allowed modules' own code, not what they import (os.fork, ...)
            origin = getattr(target, "__module__", None) or type(target).__module__
            if attr.startswith("_"):
                raise EnvError(f"env {env_id!r} is not allowed on this worker: {attr!r} is private")
            if not module_allowed(str(origin)):
                raise EnvError(
                    f"env {env_id!r} is not allowed on this worker: {attr!r} comes from "
                    f"module {origin!r}, which is not in {ALLOWED_MODULES_VAR}"
                )
        if callable(target):  # an Env class or a factory function
            return target
        raise EnvError(f"env {env_id!r}: {attr!r} is not callable")
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise EnvError(f"unknown env {env_id!r}{hint} (give a gymnasium id or 'module:callable')")


PREPROCESSING = ("auto", "atari", "none")


def _is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith(("NoFrameskip-v4", "NoFrameskip-v0"))


def preprocessing(env_id: str, options: Mapping[str, Any] | None) -> str:
    """What `env.preprocess` means for this env: "atari" (DeepMind's preprocessing, rlfarm.envs.atari) or
    "none"; "auto" picks "atari" for ALE ids."""
    chosen = (options or {}).get("preprocess", "auto")
    return ("atari" if _is_atari_id(env_id) else "none") if chosen == "auto" else chosen


def make_env(
    env_id: str, trusted: bool = True, render_mode: str | None = None, options: Mapping[str, Any] | None = None
) -> gym.Env:
    """One env; a constructor that raises is an EnvError naming the env and what it raised.
    `trusted=False` for an id read from Redis or a file (see _factory). `render_mode` ("rgb_array",
    "human") is passed to gym.make, or to a "module:callable" constructor as a keyword. `options`:
    the run's `[env]` section, for its preprocessing keys (a worker gets them from the run's metadata)."""
    factory = _factory(env_id, trusted)
    atari = preprocessing(env_id, options) == "atari"
    kwargs: dict[str, Any] = {"render_mode": render_mode} if render_mode else {}
    if atari:
        kwargs["frameskip"] = 1  # the preprocessing skips frames itself, max-pooling the last two
    try:
        env = factory(**kwargs)
        if is_turn_based(env):  # players take turns: a vector of games seen from the learner's seat
            return TurnVector(lambda: factory(**kwargs), 1, env_id, first=env)
        if is_multiagent(env):  # a PettingZoo env: its agents as the sub-envs of one game
            return AgentVector(
                lambda: to_parallel(factory(**kwargs), env_id),
                1,
                env_id,
                first=to_parallel(env, env_id),
                policy_map=tuple((options or {}).get("policy_map", ())),
            )
        if not isinstance(env, gym.Env):  # a callable that makes no env ("tempfile:mkdtemp"): one line
            raise EnvError(f"env {env_id!r}: its constructor returned {type(env).__name__}, not a gymnasium Env")
        if atari:
            from rlfarm.envs import atari as atari_wrappers

            env = atari_wrappers.wrap(env, options or {})
        return env
    except EnvError:
        raise
    except gym.error.DependencyNotInstalled as exc:
        extra = _EXTRAS.get(_entry_package(env_id))
        if extra is None:
            raise EnvError(f"env {env_id!r} needs a package that is not installed: {exc}") from exc
        raise EnvError(
            f'env {env_id!r} needs the {extra} extra, which is not installed: pip install -e ".[{extra}]" ({exc})'
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any user constructor: gym.make, a class, a factory function
        raise EnvError(f"env {env_id!r} could not be constructed: {type(exc).__name__}: {exc}") from exc


_EXTRAS = {"gymnasium.envs.mujoco": "mujoco", "ale_py": "atari"}  # env package -> rlfarm's extra


def _entry_package(env_id: str) -> str:
    """The package of a registered env's entry point ("gymnasium.envs.mujoco" for HalfCheetah-v5)."""
    entry = gym.registry[env_id].entry_point if env_id in gym.registry else None
    module = entry.partition(":")[0] if isinstance(entry, str) else ""
    return next((package for package in _EXTRAS if module == package or module.startswith(package + ".")), "")


def make_vector_env(
    env_id: str, num_envs: int, trusted: bool = True, options: Mapping[str, Any] | None = None
) -> gym.vector.VectorEnv:
    """Sub-envs in this process, with SAME_STEP autoreset (ALE ids with Atari preprocessing:
    rlfarm.envs.ale_vector.AleVector, the wrapper chain's arithmetic with a state that can be saved).

    gymnasium >= 1.0 defaults to NEXT_STEP autoreset: the step after an episode ends is a reset whose
    action is ignored. SAME_STEP instead resets inside the ending step and hands the real final
    observation over in info["final_obs"], which is what truncation bootstrapping needs.
    """
    _factory(env_id, trusted)  # the checks once, before any sub-env is made
    if preprocessing(env_id, options) == "atari" and _is_atari_id(env_id):
        from rlfarm.envs.ale_vector import AleVector

        # The wrapper chain's frames bit for bit, without its wrappers' calls per frame, and snapshots.
        if "game" in gym.registry[env_id].kwargs:
            return AleVector(env_id, num_envs, options or {})
    first = make_env(env_id, trusted, options=options)
    if isinstance(first, TurnVector):  # a turn-based game: one sub-env per game
        return first.grown_to(num_envs)
    if isinstance(first, AgentVector):  # a multi-agent env: num_envs agents, in games of first.k
        if num_envs % first.k:
            first.close()
            raise EnvError(
                f"env {env_id!r} has {first.k} agents, and each game fills one sub-env per agent: "
                f"env.num_envs = {num_envs} is not a multiple of {first.k}"
            )
        return first.grown_to(num_envs // first.k)
    return SyncVectorEnv(
        [lambda: first] + [lambda: make_env(env_id, trusted, options=options)] * (num_envs - 1),
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def episode_limit(env_id: str) -> int | None:
    """The env's registered episode limit (gymnasium's `max_episode_steps`, its TimeLimit), None when
    unknown. A registered id is read from the registry; anything else is made once to ask its spec."""
    if env_id in gym.registry:
        return gym.registry[env_id].max_episode_steps
    env = make_env(env_id)
    try:
        if env.spec is not None and env.spec.max_episode_steps is not None:
            return env.spec.max_episode_steps
        layer = env
        while isinstance(layer, gym.Wrapper):  # a constructor that wraps its env in TimeLimit itself
            if isinstance(layer, gym.wrappers.TimeLimit):
                return layer._max_episode_steps
            layer = layer.env
        return None
    finally:
        env.close()
