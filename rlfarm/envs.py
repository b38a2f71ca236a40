"""Environment construction: gymnasium ids or "module:callable", vector envs, space descriptions.

Env ids that come from Redis or from a file (a worker building a run's env, `rlfarm eval` of a
policy that names its env) are untrusted: `make_env(..., trusted=False)` builds only ids registered
with gymnasium (by installed packages) and "module:callable" / "module:EnvId" whose module is in
RLFARM_ALLOWED_ENV_MODULES (comma-separated; a name also allows its submodules), and refuses the
rest before anything is imported. The trainer builds the env the user typed: trusted.
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv


class EnvError(ValueError):
    """An env id that cannot be made, or spaces rlfarm cannot act in."""


ALLOWED_MODULES_VAR = "RLFARM_ALLOWED_ENV_MODULES"


def allowed_env_modules(environ: Any = None) -> tuple[str, ...]:
    """The module names in RLFARM_ALLOWED_ENV_MODULES (comma-separated, blanks ignored)."""
    raw = (os.environ if environ is None else environ).get(ALLOWED_MODULES_VAR, "")
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def valid_module_name(name: str) -> bool:
    """An absolute dotted module name (`a.b_c`), nothing relative, no path."""
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def env_module(env_id: str) -> str | None:
    """The module that a "module:callable" (or "module:EnvId") env id imports; None for a plain id."""
    module, sep, _ = env_id.partition(":")
    return module if sep and module else None


def allowed_modules_env(env_id: str, environ: Any = None) -> dict[str, str]:
    """{RLFARM_ALLOWED_ENV_MODULES: the current list plus the module of `env_id`}, for the environment
    of workers started for the user's own env (the embedded default); {} for a plain gymnasium id."""
    module = env_module(env_id)
    if module is None:
        return {}
    current = allowed_env_modules(environ)
    return {ALLOWED_MODULES_VAR: ",".join(current if module in current else (*current, module))}


def module_allowed(module_name: str, allowed: tuple[str, ...] | None = None) -> bool:
    allowed = allowed_env_modules() if allowed is None else allowed
    return valid_module_name(module_name) and any(
        module_name == name or module_name.startswith(name + ".") for name in allowed)


def check_env_allowed(env_id: str, where: str = "on this worker", hint: str | None = None) -> None:
    """Raise EnvError unless an untrusted env id is a registered gymnasium id or names an allowed
    module. Imports nothing. A plain id that is not registered passes: making it fails ("unknown env")
    without importing anything."""
    if env_id in gym.registry:
        return
    module = env_module(env_id)
    if module is None or module_allowed(module):
        return
    hint = hint or f"start the worker with --allow-env-module {module}"
    raise EnvError(f"env {env_id!r} is not allowed {where}: not a registered gymnasium id, and module "
                   f"{module!r} is not in {ALLOWED_MODULES_VAR} ({hint})")


def _factory(env_id: str, trusted: bool = True) -> Callable[..., gym.Env]:
    """A constructor for `env_id`. `trusted=False` (an id read from Redis or a file): allowlist first
    (check_env_allowed), and never a "module:..." string to gym.make, which would import the module."""
    if _is_atari_id(env_id) and env_id not in gym.registry:
        from rlfarm import atari

        atari.register()  # ale_py, a fixed module: registers the ALE ids (or says how to install it)
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
                raise EnvError(f"env {env_id!r} is not allowed on this worker: {attr!r} comes from "
                               f"module {origin!r}, which is not in {ALLOWED_MODULES_VAR}")
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
    """What `env.preprocess` means for this env: "atari" (DeepMind's preprocessing, rlfarm.atari) or
    "none"; "auto" picks "atari" for ALE ids."""
    chosen = (options or {}).get("preprocess", "auto")
    return ("atari" if _is_atari_id(env_id) else "none") if chosen == "auto" else chosen


def make_env(env_id: str, trusted: bool = True, render_mode: str | None = None,
             options: Mapping[str, Any] | None = None) -> gym.Env:
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
        if atari:
            from rlfarm import atari as atari_wrappers

            env = atari_wrappers.wrap(env, options or {})
        return env
    except EnvError:
        raise
    except gym.error.DependencyNotInstalled as exc:
        extra = _EXTRAS.get(_entry_package(env_id))
        if extra is None:
            raise EnvError(f"env {env_id!r} needs a package that is not installed: {exc}") from exc
        raise EnvError(f"env {env_id!r} needs the {extra} extra, which is not installed: "
                       f'pip install -e ".[{extra}]" ({exc})') from exc
    except Exception as exc:  # noqa: BLE001 - any user constructor: gym.make, a class, a factory function
        raise EnvError(f"env {env_id!r} could not be constructed: {type(exc).__name__}: {exc}") from exc


_EXTRAS = {"gymnasium.envs.mujoco": "mujoco", "ale_py": "atari"}  # env package -> rlfarm's extra


def _entry_package(env_id: str) -> str:
    """The package of a registered env's entry point ("gymnasium.envs.mujoco" for HalfCheetah-v5)."""
    entry = gym.registry[env_id].entry_point if env_id in gym.registry else None
    module = entry.partition(":")[0] if isinstance(entry, str) else ""
    return next((package for package in _EXTRAS if module == package or module.startswith(package + ".")), "")


def make_vector_env(env_id: str, num_envs: int, trusted: bool = True,
                    options: Mapping[str, Any] | None = None) -> "gym.vector.VectorEnv":
    """Sub-envs in this process, with SAME_STEP autoreset (ALE ids with Atari preprocessing: ale-py's
    own vector env where it has one, rlfarm.atari.NativeVector).

    gymnasium >= 1.0 defaults to NEXT_STEP autoreset: the step after an episode ends is a reset whose
    action is ignored. SAME_STEP instead resets inside the ending step and hands the real final
    observation over in info["final_obs"], which is what truncation bootstrapping needs.
    """
    _factory(env_id, trusted)  # the checks once, before any sub-env is made
    if preprocessing(env_id, options) == "atari" and _is_atari_id(env_id):
        from rlfarm import atari

        # The wrapper chain's frames, without a Python call per emulated frame.
        if atari.native_vector_available() and "game" in gym.registry[env_id].kwargs:
            return atari.NativeVector(env_id, num_envs, options or {})
    return SyncVectorEnv([lambda: make_env(env_id, trusted, options=options)] * num_envs,
                         autoreset_mode=AutoresetMode.SAME_STEP)


OBS_DTYPES = ("float32", "uint8")  # what observations are kept as (see SpaceSpec)


@dataclass(frozen=True)
class SpaceSpec:
    """What a network and a rollout need to know about an env's spaces.

    Observations keep their shape and one of two dtypes end to end (env -> rollout -> result ->
    replay -> minibatch): uint8 stays uint8 (images: 4x smaller than float32 on the wire and in
    replay, scaled to [0, 1] inside the network), everything else is cast once, in `collect`, to
    float32 (float64 envs included). A uint8 observation of three dimensions is an image, laid out
    HWC or CHW (`image_layout`); anything else is a vector (flattened if it has more dimensions).
    """

    obs_dim: int  # number of observation values (the product of obs_shape)
    discrete: bool
    action_dim: int  # number of actions if discrete, else the Box dimension
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    obs_shape: tuple[int, ...] = ()  # () means (obs_dim,)
    obs_dtype: str = "float32"  # "float32" or "uint8"

    def __post_init__(self) -> None:
        if not self.obs_shape:
            object.__setattr__(self, "obs_shape", (int(self.obs_dim),))
        if self.obs_dtype not in OBS_DTYPES:
            raise EnvError(f"observation dtype {self.obs_dtype!r} is not supported ({', '.join(OBS_DTYPES)})")

    @property
    def is_image(self) -> bool:
        return self.obs_dtype == "uint8" and len(self.obs_shape) == 3

    @property
    def image_layout(self) -> str:
        """"CHW" when the first axis looks like channels (at most 4 and smaller than the last), else "HWC"."""
        first, last = self.obs_shape[0], self.obs_shape[-1]
        return "CHW" if first <= 4 and first < last else "HWC"

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one action as stored: () for a discrete action, (action_dim,) for a Box."""
        return () if self.discrete else (self.action_dim,)

    @property
    def action_dtype(self) -> str:
        return "int64" if self.discrete else "float32"

    def to_dict(self) -> dict[str, Any]:
        return {"obs_dim": self.obs_dim, "obs_shape": list(self.obs_shape), "obs_dtype": self.obs_dtype,
                "discrete": self.discrete, "action_dim": self.action_dim,
                "action_low": list(self.action_low), "action_high": list(self.action_high)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpaceSpec":
        return cls(int(d["obs_dim"]), bool(d["discrete"]), int(d["action_dim"]),
                   tuple(d["action_low"]), tuple(d["action_high"]),
                   tuple(int(x) for x in d.get("obs_shape", ())), str(d.get("obs_dtype", "float32")))



def space_spec(env: gym.Env) -> SpaceSpec:
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise EnvError(f"observation space {obs_space} is not supported: rlfarm acts on Box observations "
                       f"(vectors, or HxWxC / CxHxW uint8 images); wrap the env to flatten "
                       f"{type(obs_space).__name__} observations into a Box")
    shape = tuple(int(x) for x in obs_space.shape)
    if not shape or 0 in shape:
        raise EnvError(f"observation space {obs_space} is not supported: it holds no values")
    obs_dtype = "uint8" if obs_space.dtype == np.uint8 else "float32"
    if not (obs_dtype == "uint8" and len(shape) == 3):
        shape = (int(np.prod(shape)),)  # vectors (and anything that is not an image) are flattened
    obs = {"obs_shape": shape, "obs_dtype": obs_dtype}
    obs_dim = int(np.prod(shape))
    if isinstance(act_space, gym.spaces.Discrete):
        return SpaceSpec(obs_dim, True, int(act_space.n), **obs)
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return SpaceSpec(obs_dim, False, int(act_space.shape[0]),
                         tuple(float(x) for x in act_space.low), tuple(float(x) for x in act_space.high), **obs)
    raise EnvError(f"action space {act_space} is not supported (Discrete or 1-D Box)")


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


def describe(env_id: str, options: Mapping[str, Any] | None = None) -> SpaceSpec:
    """Make the env once (with the run's preprocessing `options`) to read its spaces; also the check
    that the id is valid."""
    env = make_env(env_id, options=options)
    try:
        return space_spec(env)
    finally:
        env.close()
