"""RUN names a run the same way for every command (a run id under --logdir, or a run directory), and
`rlfarm runs` lists the runs on disk with their state and best score, no farm needed (issue 51:
`rlfarm plot RUN` said "no run directory" where `rlfarm eval RUN` worked; no list of local runs)."""

from __future__ import annotations

import fcntl
import json
import os

from click.testing import CliRunner

from cli import main
from rlfarm.runio.runs import local_runs


def _run(root, run_id, *, summary=None, evals=(), progress=(), embedded=False, algo="ppo"):
    d = root / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algo": algo, "env": {"id": "CartPole-v1"}}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if evals:
        rows = "".join(f"{step},1.0,{mean},1.0,10,1,0\n" for step, mean in evals)
        (d / "evals.csv").write_text(
            "global_step,wall_time,mean_return,std_return,episodes,policy_version,confirmation\n" + rows
        )
    if progress:
        (d / "progress.csv").write_text("global_step,wall_time\n" + "".join(f"{s},1.0\n" for s in progress))
    if embedded:
        (d / "cluster.json").write_text(json.dumps({"redis_url": "redis://127.0.0.1:1/0", "pids": []}))
    return d


def test_runs_lists_each_run_with_its_state_steps_best_evaluation_and_farm(tmp_path):
    _run(tmp_path, "done", summary={"env_steps": 20000, "best_eval_mean_return": 419.3}, embedded=True)
    _run(tmp_path, "stopped", evals=[(4096, 50.0), (8192, 120.5)], progress=[4096, 8192, 12288], algo="dqn")
    live = _run(tmp_path, "live", progress=[4096])
    (tmp_path / "not-a-run").mkdir()
    fd = os.open(live / "trainer.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a trainer writing it now
    try:
        rows = {r.run_id: r for r in local_runs(tmp_path)}
        out = CliRunner().invoke(main, ["runs", "--logdir", str(tmp_path)])
    finally:
        os.close(fd)
    assert set(rows) == {"done", "stopped", "live"}
    assert (rows["done"].state, rows["done"].env_steps, rows["done"].best_eval, rows["done"].farm) == (
        "finished",
        20000,
        419.3,
        "embedded",
    )
    assert (rows["stopped"].state, rows["stopped"].env_steps, rows["stopped"].best_eval) == ("stopped", 12288, 120.5)
    assert (rows["live"].state, rows["live"].env_steps, rows["live"].best_eval, rows["live"].farm) == (
        "training",
        4096,
        None,
        "farm",
    )
    assert out.exit_code == 0, out.output
    line = next(line for line in out.output.splitlines() if line.startswith("done "))
    assert line.split() == ["done", "ppo", "CartPole-v1", "finished", "20,000", "419.3", "embedded"]
    empty = CliRunner().invoke(main, ["runs", "--logdir", str(tmp_path / "none")])
    assert empty.exit_code == 0 and "no runs in" in empty.output


def test_plot_takes_a_run_id_as_eval_does(tmp_path):
    d = _run(tmp_path, "curves", progress=[4096, 8192])
    episodes = "".join(f"{20 * i},0.{i},{10.0 + i},{20},{i % 2}\n" for i in range(1, 40))
    (d / "episodes.csv").write_text("global_step,wall_time,episodic_return,episodic_length,policy_version\n" + episodes)
    by_id = CliRunner().invoke(main, ["plot", "curves", "--logdir", str(tmp_path), "-o", str(tmp_path / "a.png")])
    assert by_id.exit_code == 0, by_id.output
    by_dir = CliRunner().invoke(main, ["plot", str(tmp_path / "curves"), "-o", str(tmp_path / "b.png")])
    assert by_dir.exit_code == 0, by_dir.output
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0
    missing = CliRunner().invoke(main, ["plot", "nosuch", "--logdir", str(tmp_path)])
    assert missing.exit_code == 2 and "no run 'nosuch': neither nosuch/ nor" in missing.output
