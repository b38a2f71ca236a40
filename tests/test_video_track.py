"""`rlfarm train --capture-video` (greedy evaluation episodes to RUN_DIR/videos/*.mp4) and `--track`
(the run in MLflow: params, progress metrics at env steps, policy files as artifacts).

One short embedded run with both, read back from its run directory and with MLflow's own client;
the checks at start and the MLflow sink on their own in-process (unit tier)."""

from __future__ import annotations

import math
import os
import sys

import pytest

from .conftest import WORKER_ENV, read_csv, run_command

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("tracked-run")

SMALL = [
    "--total-steps",
    "2048",
    "--workers",
    "1",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=512",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "eval.interval=1024",
    "--set",
    "eval.episodes=2",
]


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    """What rlfarm sets in its process for rendering offscreen and MLflow's file store, set here so
    that it is taken back after each test (the pytest process's environment stays as it was)."""
    for var, value in (
        ("SDL_VIDEODRIVER", "dummy"),
        ("PYGAME_HIDE_SUPPORT_PROMPT", "1"),
        ("MLFLOW_ALLOW_FILE_STORE", "true"),
    ):
        monkeypatch.setenv(var, value)


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A cartpole-ppo run of 2,048 env steps, evaluated twice, with --capture-video and --track."""
    pytest.importorskip("moviepy")
    pytest.importorskip("mlflow")
    pytest.importorskip("pygame")  # CartPole draws its frames with it (the video extra has it)
    root = tmp_path_factory.mktemp("tracked")
    # As a user's shell has it: no SDL driver chosen, no MLflow settings (rlfarm sets what it needs).
    env = {**os.environ, **WORKER_ENV}
    for var in ("SDL_VIDEODRIVER", "PYGAME_HIDE_SUPPORT_PROMPT", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    result = run_command(
        "train",
        "--run-id",
        "tracked",
        "--logdir",
        str(root / "runs"),
        *SMALL,
        "--capture-video",
        "--track",
        "--track-uri",
        str(root / "mlruns"),
        "--track-experiment",
        "p7",
        env=env,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, root / "runs" / "tracked", (root / "mlruns").as_uri()


@pytest.mark.farm
def test_capture_video_records_each_evaluation_to_an_mp4(tracked_run):
    result, run_dir, _ = tracked_run
    evals = read_csv(run_dir / "evals.csv")
    videos = sorted((run_dir / "videos").iterdir())
    assert [v.name for v in videos] == [
        f"step-{int(e['global_step']):09d}-v{e['policy_version']}.mp4" for e in evals
    ], videos  # one per evaluation; no scratch left
    for video in videos:
        head = video.read_bytes()[:12]
        assert video.stat().st_size > 1000 and head[4:8] == b"ftyp", (video, head)  # an MP4 container
    # Offscreen rendering says nothing of a display, and pygame's greeting is not printed.
    assert "XDG_RUNTIME_DIR" not in result.stderr + result.stdout and "pygame" not in result.stdout


@pytest.mark.farm
def test_track_logs_params_metrics_and_artifacts_to_mlflow(tracked_run):
    _, run_dir, uri = tracked_run
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("p7")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["algo"] == "ppo" and params["env.id"] == "CartPole-v1" and params["eval.interval"] == "1024"
    assert params["policy.hidden_sizes"] == "[64, 64]"

    progress = read_csv(run_dir / "progress.csv")
    sps = client.get_metric_history(run.info.run_id, "charts/SPS")
    assert [m.step for m in sps] == [int(row["global_step"]) for row in progress]  # env steps, row by row
    assert [m.value for m in sps] == pytest.approx([float(row["charts/SPS"]) for row in progress], rel=1e-6)
    returns = client.get_metric_history(run.info.run_id, "charts/episodic_return")
    assert returns and all(0 < m.step <= 2048 and 8 <= m.value <= 500 for m in returns)
    losses = client.get_metric_history(run.info.run_id, "losses/value_loss")
    assert losses and all(math.isfinite(m.value) for m in losses)
    evals = client.get_metric_history(run.info.run_id, "eval/mean_return")
    assert [m.step for m in evals] == [int(e["global_step"]) for e in read_csv(run_dir / "evals.csv")]

    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"best_policy.safetensors", "final_policy.safetensors", "summary.json", "videos"} <= files, files
    assert len(client.list_artifacts(run.info.run_id, "videos")) == len(list((run_dir / "videos").iterdir()))


# ---- at start, and the sinks on their own, in-process -------------------------------------------
# (Importing mlflow runs `uname -p`, and moviepy looks for ffmpeg and ffplay: those tests are `process`.)
def _train_error(args: list[str]) -> str:
    from click.testing import CliRunner

    from cli import main

    result = CliRunner().invoke(main, ["train", *args])
    # A package missing here is no usage error: 1, as `rlfarm eval --video` exits (issue 51: 2 here).
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("rlfarm: error: "), line
    return line


def test_capture_video_without_moviepy_is_one_line_at_start(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "moviepy", None)  # import moviepy raises ImportError
    line = _train_error(["--capture-video", "--logdir", str(tmp_path)])
    assert line == 'rlfarm: error: --capture-video needs moviepy, which is not installed: pip install -e ".[video]"'
    assert not any(tmp_path.iterdir())


def test_track_without_mlflow_is_one_line_at_start(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    line = _train_error(["--track", "--logdir", str(tmp_path)])
    assert line.startswith('rlfarm: error: --track logs to MLflow, which is not installed: pip install -e ".[track]"')
    assert not any(tmp_path.iterdir())


def test_tracking_uri_from_the_option_the_environment_or_mlruns(monkeypatch, tmp_path):
    from rlfarm.observe.tracking import Tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert Tracking.resolve() == Tracking((tmp_path / "mlruns").as_uri(), "rlfarm")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert Tracking.resolve(experiment="x") == Tracking("http://mlflow.example:5000", "x")
    assert Tracking.resolve("file:///srv/mlruns").uri == "file:///srv/mlruns"
    assert Tracking.resolve("file:./here").uri == (tmp_path / "here").as_uri()


def _sink(tmp_path, resume: bool = False):
    pytest.importorskip("mlflow")
    from rlfarm import config as C
    from rlfarm.observe.tracking import MlflowRun, Tracking

    cfg = C.build("cartpole-ppo", ["run_id=sink"])
    return MlflowRun(Tracking((tmp_path / "mlruns").as_uri(), "e"), tmp_path / "sink", C.to_dict(cfg), resume=resume)


@pytest.mark.process
def test_the_mlflow_sink_logs_rows_episodes_and_a_resumed_run_goes_on_in_its_mlflow_run(tmp_path):
    sink = _sink(tmp_path)
    sink.episodes(512, [10.0, 20.0], [10, 20])
    sink.scalars(512, {"global_step": 512, "wall_time": 1.0, "charts/SPS": 100.0, "losses/value_loss": math.nan})
    sink.close(KeyboardInterrupt())
    client = mlflow_client(sink.tracking.uri)
    assert client.get_run(sink.run_id).info.status == "KILLED"
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "charts/episodic_return")] == [
        (512, 10.0),
        (512, 20.0),
    ]
    assert client.get_metric_history(sink.run_id, "losses/value_loss") == []  # NaN: no update yet
    again = _sink(tmp_path, resume=True)
    assert again.run_id == sink.run_id and client.get_run(sink.run_id).info.status == "RUNNING"
    again.scalars(1024, {"charts/SPS": 90.0})
    again.close(None)
    assert [m.step for m in client.get_metric_history(sink.run_id, "charts/SPS")] == [512, 1024]
    assert client.get_run(sink.run_id).info.status == "FINISHED"


@pytest.mark.process
def test_a_failing_tracking_store_warns_once_and_the_run_goes_on(tmp_path, caplog):
    sink = _sink(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError("the tracking server went away")

    sink.client.log_batch = refuse
    for step in (512, 1024):
        sink.scalars(step, {"charts/SPS": 1.0})
    sink.close(None)
    warned = [r.getMessage() for r in caplog.records if "MLflow at" in r.getMessage()]
    assert len(warned) == 1 and "the run goes on logging to its run directory only" in warned[0]
    assert "OSError: the tracking server went away" in warned[0]


def test_a_video_that_cannot_be_recorded_warns_once_and_the_run_goes_on(tmp_path, caplog):
    from rlfarm import config as C
    from rlfarm.envs import describe
    from rlfarm.observe.video import EvalVideos

    cfg = C.build("cartpole-ppo", [])
    videos = EvalVideos(tmp_path, cfg, describe(cfg.env.id), {1: b"not a policy", 2: b"nor this"}.get)
    videos.evaluation(512, [1.0], 1, False)
    videos.evaluation(1024, [1.0], 2, False)
    warned = [r.getMessage() for r in caplog.records if "--capture-video" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("--capture-video: recording policy v1 failed, no more videos")
