"""`rlfarm.load(path)`: a saved policy file as a Stable-Baselines3-style model, for scripts that act
with a trained policy themselves (zoo's `enjoy`, a notebook, an env loop of the user's own):

    policy = rlfarm.load("runs/RUN/best_policy.safetensors")
    env = policy.make_env()                       # the env it was trained on, preprocessing included
    obs, _ = env.reset(seed=0)
    action, _ = policy.predict(obs, deterministic=True)

The file is read as `rlfarm eval` reads it (rlfarm.evaluation.playback): its signature checked with
RLFARM_SECRET when set, the actor built by the algorithm its metadata names and checked against the
spaces it was trained on. Acting goes through the same actor a worker uses (numpy for MLPs, without
importing torch; ONNX Runtime or torch for CNNs), so `predict` picks the actions the farm's greedy
evaluations pick. `policy.network` builds the torch network on first use (exports, fine-tuning).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlfarm.errors import PolicyFileError


class LoadedPolicy:
    """A policy file's network and the actor it acts with. `predict(obs)` takes one observation or a
    batch (a leading batch dimension) and returns `(action, None)` (the None is SB3's recurrent state)."""

    def __init__(self, stored: Any, actor: Any, spec: Any, seed: int | None = None, **acting: Any):
        self.stored = stored
        self.algo: str = stored.algo
        self.spec = spec
        # Acting options of the algorithm's actor (DQN: epsilon, TD3: noise), used by deterministic=False.
        self.actor = actor.with_options(**acting)
        self.rng = np.random.default_rng(seed)
        self._network: Any = None

    @property
    def network(self) -> Any:
        """The policy's torch module (in eval mode), built on first use: for exports and fine-tuning."""
        if self._network is None:
            from rlfarm.algos.saved import load_network
            from rlfarm.config import policy_config

            built = load_network(
                self.algo, self.spec, policy_config(self.stored.policy_config), self.stored.state, self.stored.meta
            )
            self._network = built.eval()
        return self._network

    @property
    def env_id(self) -> str | None:
        return self.stored.meta.get("env")

    @property
    def version(self) -> str:
        return self.stored.version

    @property
    def meta(self) -> dict[str, str]:
        """The file's metadata (algo, env, version, eval_mean_return, ...)."""
        return dict(self.stored.meta)

    def make_env(self, render_mode: str | None = None, env_id: str | None = None) -> Any:
        """The env the policy was trained on, with the run's preprocessing (Atari's), or `env_id` (a
        gymnasium id or `module:callable` you trust); an id named by the file goes through the
        workers' allowlist, as in `rlfarm eval`."""
        from rlfarm.errors import PlaybackError
        from rlfarm.evaluation.playback import open_env

        try:
            return open_env(self.stored, env_id, render_mode)[0]
        except PlaybackError as exc:
            raise PolicyFileError(str(exc)) from None

    def _batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        """`obs` as a batch the actor takes, and whether it was a single observation."""
        spec, array = self.spec, np.asarray(obs)
        if spec.is_image:
            if array.shape == spec.obs_shape:
                return array[None].astype(np.uint8, copy=False), True
            if array.ndim == 4 and array.shape[1:] == spec.obs_shape:
                return array.astype(np.uint8, copy=False), False
        elif array.ndim >= 2 and int(np.prod(array.shape[1:])) == spec.obs_dim:
            return array.reshape(len(array), spec.obs_dim).astype(np.float32, copy=False), False
        elif array.size == spec.obs_dim:
            return array.reshape(1, spec.obs_dim).astype(np.float32, copy=False), True
        want = list(spec.obs_shape) if spec.is_image else [spec.obs_dim]
        raise ValueError(
            f"observation of shape {list(array.shape)} does not fit this policy: it takes one "
            f"observation of shape {want}, or a batch of them (shape [N, {', '.join(map(str, want))}])"
        )

    def predict(
        self, obs: Any, state: Any = None, episode_start: Any = None, deterministic: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Actions for `obs`: greedy with `deterministic=True`, else sampled from the policy (PPO's
        distribution, SAC's Gaussian; DQN and TD3 explore only with the `epsilon` or `noise` given to
        `load`). Continuous actions are clipped to the env's bounds, as the farm's episodes clip them.

        A recurrent policy (policy.recurrent), as sb3-contrib's RecurrentPPO: `state` is what the last
        call returned (None: every episode starts), `episode_start` (bool, one per observation) marks
        the observations that begin an episode, whose memory is zeroed first; returns (actions, the next
        state, shaped (N, state size)). A feed-forward policy keeps no state and returns None for it."""
        batch, single = self._batch(obs)
        if self.actor.recurrent:
            n = len(batch)
            self.actor.begin(n, None if state is None else np.asarray(state, np.float32).reshape(n, -1))
            if episode_start is not None:
                self.actor.episodes_started(np.asarray(episode_start, bool).reshape(n))
        actions, _, _ = self.actor.act(batch, self.rng, deterministic)
        if not self.spec.discrete:
            actions = np.clip(
                actions, np.asarray(self.spec.action_low, np.float32), np.asarray(self.spec.action_high, np.float32)
            )
        memory = self.actor.state.copy() if self.actor.recurrent else None
        return (actions[0] if single else actions), memory

    def __repr__(self) -> str:
        return f"<rlfarm policy {self.algo} v{self.version} for {self.env_id} from {self.stored.source}>"


def load(path: str | Path, env: Any = None, seed: int | None = None, **acting: Any) -> LoadedPolicy:
    """The policy saved in `path` (best_policy.safetensors, final_policy.safetensors, an export).

    `env`: a gymnasium env (or an env id you trust) whose spaces to build the network for; default:
    the spaces the file names, or, for a file that names none (final policies, older files), the env
    it names, made once. `seed`: of the generator `predict(..., deterministic=False)` samples from.
    `acting`: the algorithm's acting options for sampling (DQN `epsilon=0.05`, TD3 `noise=0.1`).
    Raises PolicyFileError saying why a file cannot be used."""
    from rlfarm.algos.saved import load_actor
    from rlfarm.config import policy_config
    from rlfarm.envs import SpaceSpec, make_env, space_spec
    from rlfarm.errors import ConfigError, EnvError, PlaybackError, PolicyMismatch
    from rlfarm.evaluation.playback import from_file, open_env

    try:
        stored = from_file(path)
        if isinstance(env, str):
            env_id, env = env, make_env(env, trusted=True, options=stored.env_options)
            stored.meta["env"] = env_id
        if env is not None:
            spec = space_spec(env)
        elif stored.meta.get("space"):
            spec = SpaceSpec.from_dict(json.loads(stored.meta["space"]))
        else:  # no spaces in the file: the env it names tells them
            made, _ = open_env(stored)
            try:
                spec = space_spec(made)
            finally:
                made.close()
        actor = load_actor(stored.algo, spec, policy_config(stored.policy_config), stored.state, stored.meta)
    except PolicyMismatch as exc:
        where = stored.meta.get("env") or getattr(getattr(env, "spec", None), "id", None) or "given"
        raise PolicyFileError(f"policy {path} does not fit env {where}: {exc}") from None
    except (PlaybackError, ConfigError, EnvError) as exc:
        raise PolicyFileError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    try:
        return LoadedPolicy(stored, actor, spec, seed, **acting)
    except ValueError as exc:  # an acting option the algorithm does not have, or a bad value
        raise PolicyFileError(f"{path}: {exc}") from None
