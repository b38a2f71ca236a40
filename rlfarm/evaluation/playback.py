"""Playing a stored policy, what `rlfarm eval` does: a saved file or a version in Redis, on the env it
was trained on (or another one named), for greedy episodes, recorded to video or shown in a window.

Whatever a file or Redis says is untrusted: the policy's signature is checked with RLFARM_SECRET (when
set), its env id goes through the workers' allowlist unless the user typed it, and the network is
built by the algorithm it names, checked against the env's spaces (rlfarm.algos.saved). Every failure
is a `PlaybackError`: one line and an exit status for the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlfarm.errors import PlaybackError


@dataclass
class StoredPolicy:
    """A policy's tensors and what its file or run says of it."""

    state: dict[str, Any]
    meta: dict[str, str]
    policy_config: dict[str, Any]  # the run's [policy] section: how its network was built
    env_options: dict[str, Any]  # the run's [env] section: preprocessing (Atari)
    algo: str
    source: str  # for messages: the file, or "RUN vN"

    @property
    def version(self) -> str:
        return str(self.meta.get("version", "?"))


def from_file(path: str | Path) -> StoredPolicy:
    """A saved policy file (best_policy.safetensors, final_policy.safetensors, an export)."""
    from rlfarm.algos.saved import algo_of
    from rlfarm.core import codec
    from rlfarm.core.signing import secret_from_env
    from rlfarm.errors import SignatureError

    try:  # with RLFARM_SECRET set, the file's hmac must verify
        state, meta = codec.decode_policy(Path(path).read_bytes(), secret_from_env(), arrays="numpy")
    except (codec.CodecError, SignatureError) as exc:  # not a policy, or forged: name the file
        raise PlaybackError(f"{exc} (file {path})") from None
    except OSError as exc:
        raise PlaybackError(f"cannot read {path}: {exc.strerror or exc}") from None
    return StoredPolicy(
        state,
        meta,
        json.loads(meta.get("policy", "{}")),
        json.loads(meta.get("env_options", "{}")),
        algo_of(meta, state),
        str(path),
    )


def with_policies(policy: StoredPolicy, swaps: list[tuple[str, str]]) -> StoredPolicy:
    """`policy` (a run of several policies) with policy NAME's network taken from FILE for each
    (NAME, FILE) of `swaps`: a single policy's file (best_policy.NAME.safetensors) or a group's."""
    from rlfarm.algos.acting import policy_tensors
    from rlfarm.algos.base import prefixed

    names = sorted({key.split(".")[1] for key in policy.state if key.startswith("nets.")})
    for name, path in swaps:
        if name not in names:
            have = f"its policies are {', '.join(names)}" if names else "it is a single policy"
            raise PlaybackError(f"--policy-for {name}=...: {policy.source} has no policy {name!r} ({have})", 2)
        own = prefixed(f"nets.{name}", policy_tensors(from_file(path).state, name))
        kept = {k: v for k, v in policy.state.items() if not k.startswith(f"nets.{name}.")}
        policy.state = {**kept, **own}
        policy.source += f" with {name} from {path}"
    return policy


# What `rlfarm eval RUN` plays of a run directory, the first that exists (zoo's enjoy: the best model).
RUN_POLICY_FILES = ("best_policy.safetensors", "final_policy.safetensors")


def run_dir_of(run: str, logdir: str | None = None) -> Path:
    """The run directory `run` names (rlfarm.runio.runs.resolve, as every command reads RUN)."""
    from rlfarm.errors import NoRun
    from rlfarm.runio.runs import resolve

    try:
        return resolve(run, logdir)
    except NoRun as exc:
        raise PlaybackError(str(exc)) from None


def from_run_dir(run: str, logdir: str | None = None) -> StoredPolicy:
    """A run directory's best policy, else its final one, with the env, preprocessing and network
    settings of the run's config.json (a final policy file names no preprocessing)."""
    run_dir = run_dir_of(run, logdir)
    found = [run_dir / name for name in RUN_POLICY_FILES if (run_dir / name).is_file()]
    if not found:
        raise PlaybackError(
            f"run {run_dir.name} has no policy file yet (no {' or '.join(RUN_POLICY_FILES)} in "
            f"{run_dir}/); while it trains, play its newest version with --run {run_dir.name}"
        )
    policy = from_file(found[0])
    try:
        config = json.loads((run_dir / "config.json").read_text())
        env, policy_config = dict(config["env"]), dict(config["policy"])
        env_id = str(env["id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlaybackError(f"cannot read {run_dir / 'config.json'}: {exc!r}") from None
    policy.meta["env"], policy.env_options, policy.policy_config = env_id, env, policy_config
    return policy


def from_run(redis_url: str, run_id: str, version: int | str) -> StoredPolicy:
    """Version `version` (or "latest") of a run in Redis, with the run's own config."""
    from rlfarm.algos.saved import algo_of
    from rlfarm.core import codec
    from rlfarm.errors import PolicyError, RunNotFound, SignatureError
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore

    try:
        store = PolicyStore(connect(redis_url), run_id)
        state, meta = store.get(version, arrays="numpy")
        run_cfg = store.run_meta()["config"]
    except (codec.CodecError, PolicyError, RunNotFound, ConnectionError, SignatureError) as exc:
        raise PlaybackError(str(exc)) from None
    meta["env"] = run_cfg["env"]["id"]
    meta.setdefault("algo", run_cfg.get("algo"))
    return StoredPolicy(
        state,
        meta,
        run_cfg["policy"],
        run_cfg["env"],
        algo_of(meta, state),
        f"{run_id} v{meta.get('version', version)}",
    )


def offscreen_rendering() -> None:
    """Frames drawn in memory (videos): SDL's dummy drivers, unless the user chose others. Without,
    pygame's SDL probes for a display and prints `error: XDG_RUNTIME_DIR is invalid` on a machine
    without one, though nothing is shown. Before pygame initialises (envs draw at their first frame)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def open_env(policy: StoredPolicy, env_id: str | None = None, render_mode: str | None = None) -> tuple[Any, str]:
    """The env to play: `env_id` as typed (trusted), else the one the policy names, allowlisted as on a
    worker. Returns (env, its id)."""
    from rlfarm.envs import check_env_allowed, env_module, make_env
    from rlfarm.errors import EnvError

    typed = bool(env_id)
    env_id = env_id or policy.meta.get("env")
    if not env_id:
        raise PlaybackError("the policy does not name its env: pass --env", 2)
    if render_mode == "rgb_array":
        offscreen_rendering()
    try:
        if not typed:  # named by a file or by Redis: the allowlist, as on a worker
            check_env_allowed(
                env_id,
                where="here",
                hint=f"pass --env {env_id} if you trust it, or set RLFARM_ALLOWED_ENV_MODULES={env_module(env_id)}",
            )
        env = make_env(env_id, trusted=typed, render_mode=render_mode, options=policy.env_options)
    except EnvError as exc:
        raise PlaybackError(str(exc)) from None
    if render_mode and getattr(env, "render_mode", None) != render_mode:
        modes = ", ".join(env.metadata.get("render_modes", [])) or "none"
        raise PlaybackError(f"env {env_id} cannot render in mode {render_mode!r} (its render modes: {modes})")
    return env, env_id


def set_opponent(env: Any, env_id: str, opponent: str) -> None:
    """A turn-based game's other seat: a scripted player by name, or a policy file playing greedily."""
    from rlfarm.envs.opponents import SCRIPTED, actor_player, scripted
    from rlfarm.errors import EnvError

    if not hasattr(env, "set_opponents"):
        raise PlaybackError(f"--opponent is for turn-based games; {env_id} is not one", 2)
    try:
        if opponent in SCRIPTED:
            player = scripted(opponent, env_id)
        elif not Path(opponent).is_file():
            raise PlaybackError(f"unknown opponent {opponent!r}: {', '.join(SCRIPTED)} or a policy file", 2)
        else:
            player = actor_player(actor_for(from_file(opponent), env, env_id), deterministic=True)
    except EnvError as exc:
        raise PlaybackError(str(exc), 2) from None
    env.set_opponents([opponent], {opponent: player})


def network_for(policy: StoredPolicy, env: Any, env_id: str) -> Any:
    """The policy's torch network, built for `env`'s spaces (PlaybackError when it does not fit them)."""
    from rlfarm.algos.saved import load_network

    return _built(load_network, policy, env, env_id)


def actor_for(policy: StoredPolicy, env: Any, env_id: str) -> Any:
    """What acts with the policy on `env` (PlaybackError when it does not fit its spaces): an MLP's
    numpy actor, built without torch (rlfarm.algos.acting); a CNN's through its network."""
    from rlfarm.algos.saved import load_actor

    return _built(load_actor, policy, env, env_id)


def _built(load: Any, policy: StoredPolicy, env: Any, env_id: str) -> Any:
    from rlfarm.config import policy_config
    from rlfarm.envs import space_spec
    from rlfarm.errors import ConfigError, PolicyMismatch

    try:
        return load(policy.algo, space_spec(env), policy_config(policy.policy_config), policy.state, policy.meta)
    except PolicyMismatch as exc:
        if policy.meta.get("policy_name"):  # best_policy.NAME.safetensors: one policy of several
            raise PlaybackError(
                f"{policy.source} holds policy {policy.meta['policy_name']!r} of a run of several policies: "
                f"play it in its run with rlfarm eval RUN --policy-for {policy.meta['policy_name']}=FILE"
            ) from None
        raise PlaybackError(f"policy {policy.source} does not fit env {env_id}: {exc}") from None
    except ConfigError as exc:
        raise PlaybackError(str(exc)) from None


def play(
    actor: Any,
    env: Any,
    env_id: str,
    episodes: int,
    seed: int,
    render_mode: str | None = None,
    video_dir: str | None = None,
    name: str = "policy",
    by_policy: bool = False,
) -> np.ndarray:
    """Greedy episodes' returns, recorded (RecordVideo) or shown in a window as asked; a renderer that
    cannot work here (a missing package, no display) is a PlaybackError. `by_policy`: a multi-agent
    game of several policies gives each policy's column (rlfarm.core.rollout.run_episodes)."""
    import gymnasium as gym

    from rlfarm.core.rollout import run_episodes

    try:
        if video_dir:
            from gymnasium.wrappers import RecordVideo

            replaced = list(Path(video_dir).glob(f"{name}-episode-*.mp4"))
            if replaced:  # gymnasium warns of any folder that exists, an empty one too: only this is true
                logging.getLogger("rlfarm.eval").warning(
                    "replacing %d video(s) of the same name in %s/ (%s-episode-*.mp4)", len(replaced), video_dir, name
                )
            if getattr(env, "num_envs", None) is not None:  # a multi-agent or turn-based game
                env = GameRecorder(env, video_dir, name)
            else:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
                    env = RecordVideo(
                        env,
                        video_folder=video_dir,
                        episode_trigger=lambda _: True,
                        name_prefix=name,
                        disable_logger=True,
                    )
        if render_mode == "human":
            env.reset(seed=seed)  # opens the window (episodes reset again with the same seeds)
            pygame = sys.modules.get("pygame")  # classic-control and box2d envs draw with pygame
            driver = pygame.display.get_driver() if pygame and pygame.display.get_init() else None
            if driver in ("offscreen", "dummy") and not os.environ.get("SDL_VIDEODRIVER"):
                raise PlaybackError(
                    f"--render could not open a window on DISPLAY={os.environ.get('DISPLAY', '')!r} "
                    f"(SDL fell back to its {driver} driver); record the episodes to files "
                    f"instead with --video DIR"
                )
        returns = run_episodes(actor, env, episodes, seed, by_policy=by_policy)
        env.close()  # RecordVideo writes the last episode's file on close
        return returns
    except gym.error.DependencyNotInstalled as exc:
        raise PlaybackError(f"rendering {env_id} needs a package that is not installed: {exc}") from None
    except (PlaybackError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - a renderer failing (no display, no GL) is one line
        if not render_mode:
            raise
        what = "record" if video_dir else "show"
        raise PlaybackError(
            f"cannot {what} {env_id}'s episodes ({render_mode} rendering failed): "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None


class GameRecorder:
    """A multi-agent (or turn-based) game of one, its frames recorded, a game per .mp4 file named as
    gymnasium's RecordVideo names episodes (`NAME-episode-K.mp4`); the rest is the game's own. A game
    that ends is reset in the same step (rlfarm.envs.agents), so its file ends one frame short."""

    def __init__(self, env: Any, folder: str | Path, name: str):
        self.env, self.folder, self.name = env, Path(folder), name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.frames: list[np.ndarray] = []
        self.episode = 0
        self.fps = int(getattr(env.games[0], "metadata", {}).get("render_fps", 30) or 30)

    def __getattr__(self, attribute: str) -> Any:  # num_envs, set_opponents, finished, ...
        return getattr(self.env, attribute)

    def _frame(self) -> None:
        frame = self.env.render()
        if frame is not None:
            self.frames.append(np.asarray(frame))

    def _write(self) -> None:
        if not self.frames:
            return
        from moviepy.video.io.ImageSequenceClip import ImageSequenceClip

        path = self.folder / f"{self.name}-episode-{self.episode}.mp4"
        ImageSequenceClip(self.frames, fps=self.fps).write_videofile(str(path), logger=None)
        self.frames, self.episode = [], self.episode + 1

    def reset(self, **kwargs: Any) -> Any:
        self._write()
        out = self.env.reset(**kwargs)
        self._frame()
        return out

    def step(self, actions: Any) -> Any:
        out = self.env.step(actions)
        self._frame()
        return out

    def close(self) -> None:
        self._write()
        self.env.close()
