"""`rlfarm plot`: a real short run, plotted; the plotted series checked against its CSV files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from rlfarm.commands.plot import curves, last_of_each_log, read_run, rolling_mean, wall_unit

from .conftest import read_csv, run_cli, usage_error_line

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("plot-run")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run on the embedded default: 2 PPO iterations, greedy evaluations at 4096 and 8192."""
    logdir = tmp_path_factory.mktemp("plot-runs")
    result = run_cli(
        "train",
        "--preset",
        "cartpole-ppo",
        "--total-steps",
        "8192",
        "--workers",
        "1",
        "--run-id",
        "plot-run",
        "--logdir",
        str(logdir),
        "--set",
        "eval.interval=4096",
        "--set",
        "eval.episodes=4",
    )
    assert result.returncode == 0, result.stderr
    return logdir / "plot-run"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.farm  # the run comes from real Redis and Celery workers
def test_plot_writes_a_png_with_both_curves(run_dir, tmp_path):
    result = run_cli("plot", str(run_dir))
    assert result.returncode == 0, result.stderr
    out = run_dir / "curves.png"
    assert f"wrote {out}" in result.stdout
    width, height = png_size(out)
    assert 800 <= width <= 4000 and 300 <= height <= 2000
    assert out.stat().st_size > 20_000  # two panels of points and lines, not an empty canvas

    # Both series are drawn: pixels in the training (tab:blue) and evaluation (tab:orange) colours.
    from matplotlib.image import imread

    rgb = imread(out)[..., :3]
    for colour in ((0.122, 0.467, 0.706), (1.0, 0.498, 0.055)):
        assert (np.abs(rgb - colour).max(axis=-1) < 0.02).sum() > 200, colour

    other = tmp_path / "elsewhere.png"
    result = run_cli("plot", str(run_dir), "-o", str(other))
    assert result.returncode == 0, result.stderr
    assert png_size(other) == (width, height)


@pytest.mark.farm  # the run comes from real Redis and Celery workers
def test_plotted_series_are_the_csv_contents(run_dir):
    episodes = read_csv(run_dir / "episodes.csv")
    evals = read_csv(run_dir / "evals.csv")
    assert len(episodes) > 20 and [e["global_step"] for e in evals] == ["4096", "8192"]
    c = curves(read_run(run_dir))

    assert c.episode_step.tolist() == [float(e["global_step"]) for e in episodes]
    assert c.episode_wall.tolist() == [float(e["wall_time"]) for e in episodes]
    assert c.episode_return.tolist() == [float(e["episodic_return"]) for e in episodes]
    # The rolling mean, once per logged step: the last 20 returns up to that step's last episode.
    returns = [float(e["episodic_return"]) for e in episodes]
    steps = [e["global_step"] for e in episodes]
    ends = [i for i in range(len(steps)) if i == len(steps) - 1 or steps[i + 1] != steps[i]]
    assert c.rolling_step.tolist() == [float(steps[i]) for i in ends]
    expected = [sum(returns[max(0, i - 19) : i + 1]) / len(returns[max(0, i - 19) : i + 1]) for i in ends]
    np.testing.assert_allclose(c.rolling_return, expected, rtol=1e-12)

    assert c.eval_step.tolist() == [4096.0, 8192.0]
    assert c.eval_mean.tolist() == [float(e["mean_return"]) for e in evals]
    assert c.eval_std.tolist() == [float(e["std_return"]) for e in evals]
    assert c.eval_wall.tolist() == [float(e["wall_time"]) for e in evals]

    config = json.loads((run_dir / "config.json").read_text())
    assert config["run_id"] in c.title and "CartPole-v1" in c.title and "PPO" in c.title


def test_pure_helpers():
    np.testing.assert_allclose(rolling_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1.0, 2.0, 4.0, 6.0])
    np.testing.assert_allclose(rolling_mean(np.array([2.0, 4.0]), 20), [2.0, 3.0])
    assert rolling_mean(np.array([]), 3).tolist() == []
    assert last_of_each_log(np.array([5.0, 5.0, 9.0, 9.0, 9.0, 12.0])).tolist() == [1, 4, 5]
    assert last_of_each_log(np.array([])).tolist() == []
    assert wall_unit(59) == (1.0, "wall time (s)") and wall_unit(700)[0] == 60.0
    assert wall_unit(4 * 3600)[0] == 3600.0


@pytest.mark.farm  # the run comes from real Redis and Celery workers
def test_errors_are_one_clear_line(tmp_path, run_dir):
    assert "no run directory at" in usage_error_line(run_cli("plot", str(tmp_path / "missing")))
    assert "has no episodes.csv" in usage_error_line(run_cli("plot", str(tmp_path)))

    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "episodes.csv").write_text("global_step,wall_time,episodic_return,episodic_length,policy_version\n")
    assert "no episodes or evaluations logged yet" in usage_error_line(run_cli("plot", str(empty)))
    assert not (empty / "curves.png").exists()

    unwritable = tmp_path / "no-such-dir" / "x.png"
    assert "cannot write" in usage_error_line(run_cli("plot", str(run_dir), "-o", str(unwritable)))
