"""`rlfarm eval` of every algorithm's policies (file and Redis), env mismatches, --video and --render,
with tiny real runs trained through the CLI on the `farm` fixture."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest

from .conftest import WORKER_ENV, one_error_line, rlfarm_cmd, run_cli

# Most tests here share the `runs` fixture's runs: one test process runs them all.
pytestmark = [pytest.mark.farm, pytest.mark.xdist_group("eval-runs")]

TRAIN = {
    "dqn": ["--preset", "cartpole-dqn", "--mode", "async", "--total-steps", "2000",
            "--set", "dqn.learning_starts=256", "--set", "eval.interval=0", "--set", "target_return=inf"],
    "ppo": ["--preset", "cartpole-ppo", "--total-steps", "2048", "--set", "farm.num_tasks=2",
            "--set", "env.num_envs=1", "--set", "farm.steps_per_env=512", "--set", "ppo.num_minibatches=2"],
    "sac": ["--preset", "pendulum-sac", "--total-steps", "1000", "--set", "sac.learning_starts=400",
            "--set", "policy.hidden_sizes=[32,32]", "--set", "eval.interval=0", "--set", "target_return=inf"],
}
HAS_MOVIEPY = importlib.util.find_spec("moviepy") is not None
NO_MOVIEPY = 'moviepy is not installed (pip install -e ".[video]" or ".[test]"): --video cannot record'


@pytest.fixture(scope="module")
def runs(farm, tmp_path_factory):
    """{algo: (run id, run directory)}: one tiny run of each algorithm (CartPole; SAC: Pendulum),
    trained by the CLI."""
    logdir = tmp_path_factory.mktemp("eval-runs")
    done = {}
    for algo, args in TRAIN.items():
        run_id = f"eval-{algo}"
        result = run_cli("train", "--redis", farm.redis_url, "--run-id", run_id, "--logdir", str(logdir), *args)
        assert result.returncode == 0, result.stderr[-3000:]
        done[algo] = (run_id, logdir / run_id)
    return done


def source(runs, farm, algo: str, kind: str) -> list[str]:
    run_id, run_dir = runs[algo]
    if kind == "policy":
        return ["--policy", str(run_dir / "final_policy.safetensors")]
    return ["--run", run_id, "--redis", farm.redis_url]


@pytest.mark.parametrize("kind", ["policy", "run"])
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_eval_plays_every_algorithm_from_a_file_and_from_redis(runs, farm, algo, kind):
    result = run_cli("eval", *source(runs, farm, algo, kind), "--episodes", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("CartPole-v1, policy v") and "mean return" in line
    assert line.endswith("over 3 greedy episodes")
    mean = float(line.split("mean return ")[1].split(" ")[0])
    assert 8 <= mean <= 500  # CartPole: every episode lasts at least 8 steps, at most 500


@pytest.mark.parametrize("kind", ["policy", "run"])
def test_eval_plays_sac_from_a_file_and_from_redis(runs, farm, kind):
    result = run_cli("eval", *source(runs, farm, "sac", kind), "--episodes", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("Pendulum-v1, policy v") and line.endswith("over 2 greedy episodes")
    mean = float(line.split("mean return ")[1].split(" ")[0])
    assert -2000 <= mean <= 0  # Pendulum's rewards are at most 0, at least about -16.3 a step


@pytest.mark.parametrize("kind", ["policy", "run"])
@pytest.mark.parametrize("algo, env, what", [
    ("dqn", "Pendulum-v1", "it acts with 2 discrete actions, the env takes 1-dimensional continuous actions"),
    ("sac", "CartPole-v1", "it acts with 1-dimensional continuous actions, the env takes 2 discrete actions"),
    ("sac", "MountainCarContinuous-v0", "it takes observations of size 3, the env's have size 2"),
    ("dqn", "Acrobot-v1", "it takes observations of size 4, the env's have size 6"),
    ("ppo", "Pendulum-v1", "it takes observations of size 4, the env's have size 3"),
    ("ppo", "Acrobot-v1", "it acts with 2 discrete actions, the env takes 3 discrete actions"),
])
def test_a_policy_for_another_env_is_one_line(runs, farm, algo, env, what, kind):
    result = run_cli("eval", *source(runs, farm, algo, kind), "--env", env, "--episodes", "1")
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    named = "final_policy.safetensors" if kind == "policy" else f"eval-{algo} v"
    assert line.startswith("rlfarm: error: policy ") and named in line, line
    assert f"does not fit env {env}: " in line and what in line, line


@pytest.mark.skipif(not HAS_MOVIEPY, reason=NO_MOVIEPY)
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_video_records_one_mp4_per_episode(runs, farm, algo, tmp_path):
    """tests.tiny_envs:painted has CartPole's spaces and draws its frames with numpy (no pygame)."""
    videos = tmp_path / "videos"
    result = run_cli("eval", *source(runs, farm, algo, "policy"), "--env", "tests.tiny_envs:painted",
                     "--episodes", "2", "--video", str(videos))
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(videos.glob("*.mp4"))
    assert len(files) == 2 and all(re.fullmatch(rf"{algo}-painted-policy\d+-episode-{i}\.mp4", f.name)
                                   for i, f in enumerate(files)), files
    for f in files:
        head = f.read_bytes()[:12]
        assert head[4:8] == b"ftyp", (f, head)  # an MP4 container
    assert f"recorded 2 episodes to {videos}/" in result.stdout


@pytest.mark.skipif(not HAS_MOVIEPY, reason=NO_MOVIEPY)
def test_video_of_cartpole_records_or_names_the_missing_renderer(runs, farm, tmp_path):
    """CartPole draws its frames with pygame: with it installed there is a video, without it one line
    that says what to install."""
    videos = tmp_path / "videos"
    result = run_cli("eval", *source(runs, farm, "dqn", "policy"), "--episodes", "1", "--video", str(videos))
    if importlib.util.find_spec("pygame") is None:
        assert result.returncode == 1
        line = one_error_line(result.stderr)
        assert "rendering CartPole-v1 needs a package that is not installed" in line
        assert 'pip install "gymnasium[classic-control]"' in line
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(list(videos.glob("*.mp4"))) == 1


@pytest.mark.skipif(not HAS_MOVIEPY or importlib.util.find_spec("pygame") is None,
                    reason="CartPole's frames need pygame, the .mp4 files moviepy")
def test_video_prints_no_sdl_error_and_warns_only_of_videos_it_replaces(runs, farm, tmp_path):
    """pygame's SDL printed `error: XDG_RUNTIME_DIR is invalid` (no display, though nothing is shown) and
    gymnasium "Overwriting existing videos" for any folder that exists; a folder with this policy's
    videos is the one case to say something of, in one line."""
    env = {k: v for k, v in {**os.environ, **WORKER_ENV}.items()
           if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    videos = tmp_path / "new" / "videos"
    command = rlfarm_cmd("eval", *source(runs, farm, "dqn", "policy"), "--episodes", "1", "--video", str(videos))
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "XDG_RUNTIME_DIR" not in first.stderr and "Overwriting" not in first.stderr, first.stderr
    assert "rlfarm: warning" not in first.stderr, first.stderr
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Overwriting" not in again.stderr and "XDG_RUNTIME_DIR" not in again.stderr, again.stderr
    [line] = [line for line in again.stderr.splitlines() if line.strip()]
    assert line.startswith(f"rlfarm: warning: replacing 1 video(s) of the same name in {videos}/ (dqn-"), line


def test_video_without_moviepy_says_what_to_install(runs, farm, tmp_path):
    """A `moviepy` that cannot be imported (a stub first on the path) stands in for a missing one."""
    stub = tmp_path / "stub" / "moviepy"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named moviepy')\n")
    path = os.pathsep.join([str(stub.parent), WORKER_ENV["PYTHONPATH"]])
    result = run_cli("eval", *source(runs, farm, "ppo", "policy"), "--video", str(tmp_path / "v"),
                     env={"PYTHONPATH": path})
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "--video needs moviepy" in line and 'pip install -e ".[video]"' in line
    assert not (tmp_path / "v").exists()


def _without_display() -> dict[str, str]:
    env = {**os.environ, **WORKER_ENV}
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        env.pop(var, None)
    return env


def test_render_without_a_display_is_one_line(runs, farm):
    result = subprocess.run(rlfarm_cmd("eval", *source(runs, farm, "dqn", "policy"), "--render"),
                            capture_output=True, text=True, env=_without_display(), timeout=600)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "--render opens a window, but there is no display here" in line and "--video DIR" in line


def test_render_on_a_display_that_is_not_there_fails_clearly(runs, farm):
    """DISPLAY set, but no X server behind it: without pygame, one line says what to install; with
    it (SDL then falls back to its offscreen driver and says so itself), that no window opened."""
    env = {**_without_display(), "DISPLAY": ":4321"}
    result = subprocess.run(rlfarm_cmd("eval", *source(runs, farm, "ppo", "policy"), "--render"),
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 1
    if importlib.util.find_spec("pygame") is None:
        line = one_error_line(result.stderr)
        assert 'pip install "gymnasium[classic-control]"' in line, line
    else:
        lines = [line for line in result.stderr.splitlines() if line.startswith("rlfarm:")]
        assert len(lines) == 1 and "--render could not open a window on DISPLAY=':4321'" in lines[0], result.stderr
        assert "Traceback" not in result.stderr


def test_video_and_render_together_is_a_usage_error(tmp_path):
    result = run_cli("eval", "--policy", __file__, "--video", str(tmp_path / "v"), "--render")
    assert result.returncode == 2
    assert "give --video DIR (record) or --render (watch), not both" in one_error_line(result.stderr)


# ---- `rlfarm eval RUN` (zoo's enjoy) and rlfarm.load of the runs' files ---------------------------
def _with_version(src, dst, version: str) -> None:
    """A copy of the policy file `src` whose metadata says another version (told apart when played)."""
    from rlfarm.core import codec

    state, meta = codec.decode_policy(src.read_bytes())
    meta["version"] = version
    dst.write_bytes(codec.encode_policy(state, meta))


def test_eval_run_plays_its_best_policy_else_its_final_one(runs, tmp_path):
    import shutil

    run_id, run_dir = runs["dqn"]  # every run evaluates its final policy, so it keeps a best policy
    result = run_cli("eval", run_id, "--logdir", str(run_dir.parent), "--episodes", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    first, *_, last = result.stdout.strip().splitlines()
    assert re.fullmatch(rf"run {run_id}: best_policy\.safetensors \(policy v\d+\)", first), first
    assert last.startswith("CartPole-v1, policy v") and last.endswith("over 2 greedy episodes")

    # A run directory given as a path, without a best policy (a run that died before its first
    # evaluation): its final policy is played.
    copy = tmp_path / run_id
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.log", "events.*", "best_policy.safetensors"))
    _with_version(run_dir / "final_policy.safetensors", copy / "final_policy.safetensors", "777")
    result = run_cli("eval", str(copy), "--episodes", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == f"run {run_id}: final_policy.safetensors (policy v777)"
    assert result.stdout.strip().splitlines()[-1].startswith("CartPole-v1, policy v777: mean return ")


def test_eval_run_takes_the_env_of_its_config(runs):
    """SAC's run: Pendulum, from config.json (a final policy file names no preprocessing)."""
    run_id, run_dir = runs["sac"]
    result = run_cli("eval", run_id, "--logdir", str(run_dir.parent), "--episodes", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("Pendulum-v1, policy v")


@pytest.mark.parametrize("algo", ["dqn", "ppo", "sac"])
def test_load_acts_with_a_real_runs_final_policy(runs, algo):
    import numpy as np

    import rlfarm

    policy = rlfarm.load(runs[algo][1] / "final_policy.safetensors")
    env = policy.make_env()
    obs, _ = env.reset(seed=3)
    for _ in range(5):
        action, state = policy.predict(obs, deterministic=True)
        assert state is None and env.action_space.contains(np.asarray(action, env.action_space.dtype))
        obs, *_ = env.step(action)
    actions, _ = policy.predict(np.stack([obs] * 4), deterministic=False)
    assert len(actions) == 4
    env.close()
