"""benchmarks/curves.py, which prints docs/pong.md's table from the curves under benchmarks/results/:
where the mean of the last 20 games first reaches the target, the mean at a wall-clock mark, and where
a run stopped (its summary, or its last game when it was interrupted before writing one)."""

import csv
import json
import sys

import pytest

from benchmarks.curves import describe, main

pytestmark = pytest.mark.unit


def write_run(run_dir, returns, seconds_per_game=60.0, steps_per_game=1000, summary=None, target=18.0):
    run_dir.mkdir()
    with open(run_dir / "episodes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["global_step", "wall_time", "episodic_return", "episodic_length", "policy_version"])
        for i, r in enumerate(returns, start=1):
            w.writerow([i * steps_per_game, i * seconds_per_game, r, steps_per_game, i])
    (run_dir / "config.json").write_text(json.dumps({"seed": 3, "target_return": target}))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_target_the_mark_and_an_interrupted_runs_stop(tmp_path):
    # 40 games at -21, then 40 at +21: the mean of the last 20 passes 18 at the 20 * 39/42-th win.
    returns = [-21.0] * 40 + [21.0] * 40
    write_run(tmp_path / "run", returns)
    row = describe(tmp_path / "run", None, minutes=30)
    means = [sum(returns[i - 19 : i + 1]) / 20 for i in range(19, len(returns))]
    first = next(i for i, m in enumerate(means) if m >= 18) + 20  # games played when it is first reached
    assert row["reached_steps"] == first * 1000
    assert row["reached_min"] == pytest.approx(first)
    assert row["at_mark"] == pytest.approx(means[30 - 20])  # the 30th game ends at 30 min
    assert row["at_mark_steps"] == 30_000
    assert row["best"] == 21.0 and row["best_steps"] == 60_000
    assert row["stopped_steps"] == 80_000 and row["stopped_min"] == pytest.approx(80.0)
    assert row["seed"] == 3


def test_a_run_that_never_reaches_its_target_and_wrote_a_summary(tmp_path, capsys):
    write_run(tmp_path / "run", [-20.0] * 30, summary={"env_steps": 31_500, "wall_seconds": 1_900.0})
    row = describe(tmp_path / "run", 18.0)
    assert "reached_steps" not in row
    assert row["stopped_steps"] == 31_500 and row["stopped_min"] == pytest.approx(1_900 / 60)
    argv, sys.argv = sys.argv, ["curves.py", str(tmp_path / "run"), "--minutes", "10"]
    try:
        main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "at 10 min" in out and "not reached" in out and "31,500" in out


def test_to_score_crossings_are_where_the_mean_of_20_first_reaches_each_mark():
    """benchmarks/pong.py --to-score's table: the first game at which the mean of the last 20 games
    (20 of them at least) reaches each mark, as (env steps, seconds); None for a mark never reached."""
    from benchmarks.pong import crossings

    scores = [-21.0] * 20 + [21.0] * 20  # the k-th win makes the mean (42 k - 420) / 20
    games = [(1000 * i, 10.0 * i, score) for i, score in enumerate(scores, start=1)]
    found = crossings(games, [-15.0, 0.0, 10.0, 18.0, 21.0, 22.0])
    # -15 needs k >= 120/42 (3 wins), 0 k >= 10, 10 k >= 620/42 (15), 18 k >= 780/42 (19), 21 k = 20
    assert found == {
        -15.0: (23_000, 230.0),
        0.0: (30_000, 300.0),
        10.0: (35_000, 350.0),
        18.0: (39_000, 390.0),
        21.0: (40_000, 400.0),
        22.0: None,
    }
    assert crossings(games[:19], [-21.0]) == {-21.0: None}, "fewer than 20 games have no mean of 20"
