"""`rlfarm train --capture-video` (CleanRL's --capture-video): one greedy episode of each evaluated
version recorded to RUN_DIR/videos/step-<env steps>-v<version>.mp4 (a multi-agent or turn-based env:
one game, rlfarm.evaluation.playback.GameRecorder).

Recorded in the trainer process, from the version just evaluated (its blob is still pinned in the
store when the evaluation is logged), with gymnasium's RecordVideo over an env made with
render_mode="rgb_array": workers write no files, and a farm's machines need no renderer. The cost is
the trainer's: each evaluation holds its loop for one rendered episode and its encoding (Pendulum's
200 frames: 1.5 s on one core, ~7 ms a frame), during which it sends no task. A renderer that fails mid-run
warns once and recording stops; the run goes on.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfarm.config import RunConfig, to_dict
from rlfarm.errors import VideoError, VideoPackageMissing
from rlfarm.observe.metrics import Sink

VIDEO_DIR = "videos"
VIDEO_EXTRA = 'pip install -e ".[video]"'

log = logging.getLogger("rlfarm.video")


def render_offscreen() -> None:
    """Classic-control and Box2D envs draw with pygame: SDL's dummy driver needs no display (and
    prints no "XDG_RUNTIME_DIR is invalid"); pygame's greeting on import is not one of rlfarm's lines."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def _make(config: RunConfig) -> Any:
    from rlfarm.envs import make_env

    return make_env(config.env.id, trusted=True, render_mode="rgb_array", options=to_dict(config)["env"])


def check(config: RunConfig) -> None:
    """Before anything starts: moviepy is installed and the run's env draws a frame here."""
    import gymnasium as gym
    import numpy as np

    render_offscreen()
    try:
        import moviepy  # noqa: F401 - RecordVideo writes the .mp4 files with it
    except ImportError:
        raise VideoPackageMissing(f"--capture-video needs moviepy, which is not installed: {VIDEO_EXTRA}") from None
    env_id = config.env.id
    try:
        env = _make(config)
        try:
            if getattr(env, "render_mode", None) != "rgb_array":
                modes = ", ".join(env.metadata.get("render_modes", [])) or "none"
                raise VideoError(
                    f"--capture-video records frames, but env {env_id} cannot render in mode "
                    f"'rgb_array' (its render modes: {modes})"
                )
            env.reset(seed=config.seed)
            frame = env.render()
        finally:
            env.close()
    except gym.error.DependencyNotInstalled as exc:
        raise VideoError(
            f"--capture-video renders {env_id}, which needs a package that is not installed: "
            f"{exc} (the video extra has classic control's: {VIDEO_EXTRA})"
        ) from None
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise VideoError(f"--capture-video records frames, but env {env_id}'s render() gave no RGB image")


class EvalVideos(Sink):
    """Records one greedy episode of each evaluated version (confirmations are the same version)."""

    def __init__(
        self, run_dir: Path, config: RunConfig, space: Any, blob_of: Callable[[int], bytes | None], secret: Any = None
    ):
        """`blob_of(version)`: the version's blob as the trainer pinned it (None: not pinned any more);
        `secret`: what it was signed with."""
        render_offscreen()
        self.dir = Path(run_dir) / VIDEO_DIR
        self.config, self.space, self.blob_of, self.secret = config, space, blob_of, secret
        self.stopped = False

    def evaluation(self, global_step: int, returns: list[float], version: int, confirmation: bool) -> None:
        if confirmation or self.stopped:
            return
        blob = self.blob_of(version)
        if blob is None:
            return
        try:
            self.record(blob, version, global_step)
        except Exception as exc:  # noqa: BLE001 - a renderer or a full disk must not end the run
            self.stopped = True
            log.warning(
                "--capture-video: recording policy v%d failed, no more videos in this run: %s: %s",
                version,
                type(exc).__name__,
                " ".join(str(exc).split())[:300],
            )

    def record(self, blob: bytes, version: int, global_step: int) -> Path:
        from rlfarm.algos.saved import load_actor
        from rlfarm.core import codec
        from rlfarm.evaluation.playback import play

        cfg = self.config
        state, meta = codec.decode_policy(blob, self.secret, arrays="numpy")
        actor = load_actor(cfg.algo, self.space, cfg.policy, state, meta)
        name = f"step-{global_step:09d}-v{version}"
        # RecordVideo writes into a folder of its own (it warns about one that exists); the file is
        # moved out whole, so videos/ holds only finished recordings.
        scratch = self.dir / ".recording"
        shutil.rmtree(scratch, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        play(actor, _make(cfg), cfg.env.id, 1, cfg.seed + version, "rgb_array", str(scratch), name)
        target = self.dir / f"{name}.mp4"
        os.replace(scratch / f"{name}-episode-0.mp4", target)
        shutil.rmtree(scratch, ignore_errors=True)
        return target
