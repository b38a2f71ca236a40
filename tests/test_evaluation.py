"""Evaluation in one place (rlfarm.evaluation). First the bookkeeping (Evaluations) alone, unit tests with no
Redis, no processes: results go in, the trainer's decisions (send, record, write the best, unpin) and the pinned
versions come out. Then `rlfarm eval` and rlfarm.load (TestEvalCommand: farm tests, one test process)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import rlfarm
from rlfarm.config import from_flat
from rlfarm.evaluation.bookkeeping import (
    CONFIRM_SEED,
    EVAL_SEED,
    Evaluations,
    Record,
    Send,
    Unpin,
    WriteBest,
    WritePolicyBest,
)

from .conftest import WORKER_ENV, one_error_line, rlfarm_cmd, run_cli, run_command

TARGET = 475.0


def evaluations(**overrides) -> Evaluations:
    return Evaluations(
        from_flat(
            {
                "run_id": "ev",
                "seed": 7,
                "target_return": TARGET,
                "eval.interval": 1000,
                "eval.episodes": 10,
                "eval.tasks": 2,
                "eval.confirm_episodes": 20,
                **overrides,
            }
        )
    )


def finish(evals: Evaluations, send: Send, returns: list[float], env_steps: int = 0) -> list:
    """Hand in the results of `send`'s tasks, `returns` split evenly over them; the last call's decisions."""
    per_task = len(returns) // len(send.tasks)
    decisions: list = []
    for i, spec in enumerate(send.tasks):
        decisions = evals.received(spec.iteration, returns[i * per_task : (i + 1) * per_task], env_steps)
        if i < len(send.tasks) - 1:
            assert decisions == []  # nothing is decided before every task of the evaluation is in
    return decisions


def test_an_evaluation_sends_its_tasks_and_pins_its_version_while_they_run():
    evals = evaluations()
    send = evals.start(version=4, env_steps=1000)
    assert send.version == 4 and len(send.tasks) == 2
    assert [(s.run, s.kind, s.iteration, s.index, s.version, s.seed, s.episodes) for s in send.tasks] == [
        ("ev", "eval", 0, 0, 4, 7 + EVAL_SEED, 5),
        ("ev", "eval", 0, 1, 4, 7 + EVAL_SEED, 5),
    ]
    assert evals.pinned() == {4}
    assert evals.start(version=5, env_steps=2000).tasks[0].iteration == 1  # numbers are never reused


def test_an_evaluation_below_the_target_is_recorded_and_becomes_the_best_without_a_confirmation():
    evals = evaluations()
    decisions = finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 6 + [200.0] * 4, env_steps=1500)
    assert decisions == [Record(1000, [100.0] * 6 + [200.0] * 4, 0), WriteBest(0, 140.0)]
    assert evals.mean_return == 140.0 and evals.best_version == 0 and evals.best_mean_return == 140.0
    assert not evals.target_reached and evals.awaiting == {} and evals.in_flight == {}
    assert evals.pinned() == {0}  # the best stays pinned

    # A worse one is recorded and its version let go; the best is unchanged.
    assert finish(evals, evals.start(version=1, env_steps=2000), [50.0] * 10) == [
        Record(2000, [50.0] * 10, 1),
        Unpin(1),
    ]
    assert evals.best_version == 0 and evals.mean_return == 50.0 and evals.pinned() == {0}


def test_an_evaluation_at_the_target_asks_for_a_confirmation_of_the_same_version():
    evals = evaluations()
    decisions = finish(evals, evals.start(version=3, env_steps=1000), [500.0] * 10, env_steps=1800)
    assert len(decisions) == 2 and decisions[0] == Record(1000, [500.0] * 10, 3)
    confirm = decisions[1]
    assert isinstance(confirm, Send) and confirm.version == 3
    assert [(s.iteration, s.index, s.version, s.seed, s.episodes) for s in confirm.tasks] == [
        (1, 0, 3, 7 + CONFIRM_SEED, 10),
        (1, 1, 3, 7 + CONFIRM_SEED, 10),
    ]
    assert not evals.target_reached  # one lucky evaluation is not enough on its own
    assert evals.best_version is None  # not settled until the confirmation is in
    assert evals.awaiting == {3: [500.0] * 10} and evals.pinned() == {3}
    assert evals.in_flight[1].confirm and evals.in_flight[1].env_steps == 1800  # logged when it was sent
    assert evals.mean_return == 500.0


def test_a_confirmation_that_agrees_reaches_the_target_and_scores_all_the_episodes():
    evals = evaluations()
    confirm = finish(evals, evals.start(version=3, env_steps=1000), [490.0] * 10, env_steps=1800)[1]
    decisions = finish(evals, confirm, [480.0] * 20)
    score = (4900 + 9600) / 30
    assert decisions == [Record(1800, [480.0] * 20, 3, confirmation=True), WriteBest(3, pytest.approx(score))]
    assert evals.target_reached and evals.best_version == 3
    assert evals.best_mean_return == pytest.approx(score)
    assert evals.mean_return == 490.0  # a confirmation is not "the last evaluation"
    assert evals.awaiting == {} and evals.pinned() == {3}


def test_a_confirmation_that_disagrees_does_not_reach_the_target_but_the_version_may_still_be_best():
    evals = evaluations()
    confirm = finish(evals, evals.start(version=0, env_steps=1000), [500.0] * 10)[1]
    decisions = finish(evals, confirm, [100.0] * 20)
    score = (5000 + 2000) / 30
    assert decisions == [Record(0, [100.0] * 20, 0, confirmation=True), WriteBest(0, pytest.approx(score))]
    assert not evals.target_reached
    assert evals.best_version == 0 and evals.best_mean_return == pytest.approx(score)


def test_a_new_best_is_kept_pinned_and_the_previous_best_released():
    evals = evaluations(**{"eval.confirm_episodes": 0})
    finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 10)
    decisions = finish(evals, evals.start(version=3, env_steps=4000), [300.0] * 10)
    assert decisions == [Record(4000, [300.0] * 10, 3), WriteBest(3, 300.0), Unpin(0)]
    assert evals.best_version == 3 and evals.pinned() == {3}


def test_versions_being_evaluated_or_awaiting_a_confirmation_stay_pinned():
    evals = evaluations()
    finish(evals, evals.start(version=0, env_steps=1000), [300.0] * 10)  # v0 best
    again = evals.start(version=0, env_steps=1500)  # v0 evaluated again, still in flight
    first = evals.start(version=2, env_steps=2000)
    second = evals.start(version=2, env_steps=2500)
    assert evals.pinned() == {0, 2}
    # v2 beats v0, but v0 has an evaluation in flight: it is not released.
    assert finish(evals, first, [400.0] * 10) == [Record(2000, [400.0] * 10, 2), WriteBest(2, 400.0)]
    assert evals.pinned() == {0, 2}
    # Worse than the best, v0's last evaluation ends: released now.
    assert finish(evals, again, [10.0] * 10) == [Record(1500, [10.0] * 10, 0), Unpin(0)]
    # The best is never released, whatever its later evaluations score.
    assert finish(evals, second, [10.0] * 10) == [Record(2500, [10.0] * 10, 2)]
    assert evals.pinned() == {2}

    # A version awaiting its confirmation stays pinned though none of its tasks is in flight.
    evals = evaluations()
    finish(evals, evals.start(version=5, env_steps=1000), [500.0] * 10)  # at the target: confirmation out
    evals.in_flight.clear()  # (as if the confirmation's tasks were lost)
    assert evals.pinned() == {5}


def test_without_confirmation_episodes_the_first_evaluation_at_the_target_decides():
    evals = evaluations(**{"eval.confirm_episodes": 0})
    decisions = finish(evals, evals.start(version=2, env_steps=1000), [500.0] * 10)
    assert decisions == [Record(1000, [500.0] * 10, 2), WriteBest(2, 500.0)]
    assert evals.target_reached and evals.awaiting == {} and evals.in_flight == {}


def test_the_schedule_evaluates_once_per_interval_and_the_final_policy_once():
    evals = evaluations()
    assert evals.due(env_steps=999, version=0) == []
    [send] = evals.due(env_steps=3500, version=2)  # three intervals passed: one evaluation
    assert send.version == 2 and evals.next_eval == 4000
    assert evals.due(env_steps=3900, version=3) == []
    assert evals.final(env_steps=3900, version=2) == []  # the final policy was just evaluated
    [final] = evals.final(env_steps=3900, version=3)
    assert final.version == 3 and final.tasks[0].iteration == 1


def test_without_an_interval_only_the_final_policy_is_evaluated_and_never_confirmed():
    """eval.interval = 0 (the Atari presets): nothing on a schedule, but the final policy is evaluated
    and kept as the best policy. The target is then the rolling training return's, so an evaluation at
    it asks for no confirmation episodes."""
    evals = evaluations(**{"eval.interval": 0})
    assert evals.due(env_steps=10**6, version=9) == []
    [final] = evals.final(env_steps=10**6, version=9)
    assert final.version == 9 and len(final.tasks) == 2 and evals.pinned() == {9}
    decisions = finish(evals, final, [500.0] * 10, env_steps=10**6)
    assert decisions == [Record(10**6, [500.0] * 10, 9), WriteBest(9, 500.0)]
    assert evals.best_version == 9 and evals.in_flight == {} and evals.awaiting == {}
    assert evals.final(env_steps=10**6, version=9) == []  # evaluated already


def test_several_policies_are_ranked_each_on_its_own_and_their_bests_written_before_any_unpin():
    """A run of several policies: the first policy's returns score the run; each policy's mean is
    recorded, and a policy that beats its own best gets its part of the version written while the
    version is still pinned."""
    evals = evaluations()

    def finish_by_policy(version: int, adversary: list[float], agent: list[float]) -> list:
        send = evals.start(version=version, env_steps=1000 * (version + 1))
        decisions: list = []
        for i, spec in enumerate(send.tasks):
            half = slice(i * 2, (i + 1) * 2)
            by_policy = {"adversary": adversary[half], "agent": agent[half]}
            decisions = evals.received(spec.iteration, adversary[half], 0, by_policy)
        return decisions

    first = finish_by_policy(0, [1.0, 3.0, 1.0, 3.0], [-5.0] * 4)
    assert first == [
        Record(1000, [1.0, 3.0, 1.0, 3.0], 0, by_policy={"adversary": 2.0, "agent": -5.0}),
        WritePolicyBest("adversary", 0, 2.0),
        WritePolicyBest("agent", 0, -5.0),
        WriteBest(0, 2.0),
    ]
    # The adversary gets worse, the agents better: only the agents' best moves, before v1 is let go.
    second = finish_by_policy(1, [0.0] * 4, [-1.0] * 4)
    assert second == [
        Record(2000, [0.0] * 4, 1, by_policy={"adversary": 0.0, "agent": -1.0}),
        WritePolicyBest("agent", 1, -1.0),
        Unpin(1),
    ]
    assert evals.policy_best == {"adversary": (0, 2.0), "agent": (1, -1.0)}
    assert evals.policy_mean == {"adversary": 0.0, "agent": -1.0}
    resumed = evaluations()
    resumed.restore(json.loads(json.dumps(evals.state())))
    assert resumed.policy_best == evals.policy_best and resumed.policy_mean == evals.policy_mean
    # A policy's best is its own: equal is not better.
    assert WritePolicyBest("agent", 2, -1.0) not in finish_by_policy(2, [0.0] * 4, [-1.0] * 4)


def test_state_round_trips_through_the_trainer_checkpoint_with_the_same_keys():
    evals = evaluations()
    finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 10)
    evals.due(env_steps=1000, version=0)
    finish(evals, evals.start(version=4, env_steps=5000), [500.0] * 10)  # a confirmation in flight
    state = evals.state()
    assert state == {
        "next_eval": 2000,
        "eval_counter": 4,
        "eval_mean_return": 500.0,
        "best_eval_mean_return": 100.0,
        "best_version": 0,
        "target_reached": False,
        "policy_best": {},
        "policy_mean": {},
    }

    resumed = evaluations()
    # As rlfarm.trainer.resume stores it: inside the checkpoint's JSON state, beside the trainer's keys.
    checkpoint = json.loads(json.dumps({"run_id": "ev", "env_steps": 5000, "version": 5, **state}))
    resumed.restore(checkpoint, task_offset=1_000_000)
    assert resumed.state() == {**state, "eval_counter": 1_000_004}
    assert resumed.best_version == 0 and resumed.pinned() == {0}  # evaluations in flight died with the trainer
    assert resumed.start(version=5, env_steps=5000).tasks[0].iteration == 1_000_004

    fresh = evaluations()  # before any evaluation: NaN and -inf survive the JSON round trip
    again = evaluations()
    again.restore(json.loads(json.dumps(fresh.state())))
    assert math.isnan(again.mean_return) and again.best_mean_return == -math.inf
    assert again.best_version is None and not again.target_reached

    old = {k: v for k, v in state.items() if k not in ("best_version", "target_reached")}
    older = evaluations()  # a checkpoint written before these keys existed
    older.restore(old)
    assert older.best_version is None and older.target_reached is False and older.counter == 4


def test_the_trainer_waits_for_the_final_evaluation_even_while_it_is_held_back_for_the_runs_share():
    """On a shared farm the final evaluation's tasks may still be held in the trainer (its share is
    full) when the loop ends: the run waits for them rather than ending without its evaluation, and
    a rollout that arrives meanwhile (ASYNC) is unused."""
    from rlfarm.core.protocol import Result, TaskSpec
    from rlfarm.trainer.evaluating import EvaluationRunner

    spec = TaskSpec("ev", "eval", 3, 0, 5, 7, episodes=5)
    arrivals = [None, Result("rollout", 9, 0, task_id="late"), Result("eval", 3, 0, returns=[1.0])]

    class SharedFarm:  # the task channel's side the drain uses: its held task is sent on the 1st call
        held, pending = [spec], {}

        def outstanding(self, kind):
            return sum(1 for s in [*self.held, *self.pending.values()] if s.kind == kind)

        def next_result(self, timeout):
            if self.held:
                self.pending[spec.key] = self.held.pop()
            message = arrivals.pop(0)
            if message is not None and message.kind == "eval":
                del self.pending[spec.key]
            return message

    runner = EvaluationRunner.__new__(EvaluationRunner)
    runner.channel = SharedFarm()
    handled, unused = [], []
    runner.received = lambda message, env_steps: handled.append(message)
    runner.drain(100, unused.append)
    assert [m.kind for m in handled] == ["eval"] and [m.task_id for m in unused] == ["late"]
    assert arrivals == []


# ---- `rlfarm eval` and rlfarm.load: farm tests on tiny real runs ------------------------------
TRAIN = {
    "dqn": [
        "--preset",
        "cartpole-dqn",
        "--mode",
        "async",
        "--total-steps",
        "2000",
        "--set",
        "dqn.learning_starts=256",
        "--set",
        "eval.interval=0",
        "--set",
        "target_return=inf",
    ],
    "ppo": [
        "--preset",
        "cartpole-ppo",
        "--total-steps",
        "2048",
        "--set",
        "farm.num_tasks=2",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=512",
        "--set",
        "ppo.num_minibatches=2",
    ],
    "sac": [
        "--preset",
        "pendulum-sac",
        "--total-steps",
        "1000",
        "--set",
        "sac.learning_starts=400",
        "--set",
        "policy.hidden_sizes=[32,32]",
        "--set",
        "eval.interval=0",
        "--set",
        "target_return=inf",
    ],
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


def _without_display() -> dict[str, str]:
    return {
        k: v
        for k, v in {**os.environ, **WORKER_ENV}.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")
    }


def _with_version(src, dst, version: str) -> None:
    """A copy of the policy file `src` whose metadata says another version (told apart when played)."""
    from rlfarm.core import codec

    state, meta = codec.decode_policy(src.read_bytes())
    meta["version"] = version
    dst.write_bytes(codec.encode_policy(state, meta))


@pytest.mark.farm
@pytest.mark.xdist_group("eval-runs")  # most tests here share the `runs` fixture's runs: one test process
class TestEvalCommand:
    """`rlfarm eval` of every algorithm's policies (file and Redis), env mismatches, --video, --render,
    `rlfarm eval RUN` and rlfarm.load, on tiny real runs trained through the CLI on the `farm` fixture."""

    @pytest.mark.parametrize("kind", ["policy", "run"])
    @pytest.mark.parametrize("algo", ["dqn", "ppo"])
    def test_eval_plays_every_algorithm_from_a_file_and_from_redis(self, runs, farm, algo, kind):
        result = run_cli("eval", *source(runs, farm, algo, kind), "--episodes", "3")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        line = result.stdout.strip().splitlines()[-1]
        assert line.startswith("CartPole-v1, policy v") and "mean return" in line
        assert line.endswith("over 3 greedy episodes")
        mean = float(line.split("mean return ")[1].split(" ")[0])
        assert 8 <= mean <= 500  # CartPole: every episode lasts at least 8 steps, at most 500

    @pytest.mark.parametrize("kind", ["policy", "run"])
    def test_eval_plays_sac_from_a_file_and_from_redis(self, runs, farm, kind):
        result = run_cli("eval", *source(runs, farm, "sac", kind), "--episodes", "2")
        assert result.returncode == 0, result.stderr[-3000:]
        line = result.stdout.strip().splitlines()[-1]
        assert line.startswith("Pendulum-v1, policy v") and line.endswith("over 2 greedy episodes")
        mean = float(line.split("mean return ")[1].split(" ")[0])
        assert -2000 <= mean <= 0  # Pendulum's rewards are at most 0, at least about -16.3 a step

    @pytest.mark.parametrize("kind", ["policy", "run"])
    @pytest.mark.parametrize(
        "algo, env, what",
        [
            ("dqn", "Pendulum-v1", "it acts with 2 discrete actions, the env takes 1-dimensional continuous actions"),
            ("sac", "CartPole-v1", "it acts with 1-dimensional continuous actions, the env takes 2 discrete actions"),
            ("sac", "MountainCarContinuous-v0", "it takes observations of size 3, the env's have size 2"),
            ("dqn", "Acrobot-v1", "it takes observations of size 4, the env's have size 6"),
            ("ppo", "Pendulum-v1", "it takes observations of size 4, the env's have size 3"),
            ("ppo", "Acrobot-v1", "it acts with 2 discrete actions, the env takes 3 discrete actions"),
        ],
    )
    def test_a_policy_for_another_env_is_one_line(self, runs, farm, algo, env, what, kind):
        result = run_cli("eval", *source(runs, farm, algo, kind), "--env", env, "--episodes", "1")
        assert result.returncode == 1
        line = one_error_line(result.stderr)
        named = "final_policy.safetensors" if kind == "policy" else f"eval-{algo} v"
        assert line.startswith("rlfarm: error: policy ") and named in line, line
        assert f"does not fit env {env}: " in line and what in line, line

    @pytest.mark.skipif(not HAS_MOVIEPY, reason=NO_MOVIEPY)
    @pytest.mark.parametrize("algo", ["dqn", "ppo"])
    def test_video_records_one_mp4_per_episode(self, runs, farm, algo, tmp_path):
        """tests.tiny_envs:painted has CartPole's spaces and draws its frames with numpy (no pygame)."""
        videos = tmp_path / "videos"
        result = run_cli(
            "eval",
            *source(runs, farm, algo, "policy"),
            "--env",
            "tests.tiny_envs:painted",
            "--episodes",
            "2",
            "--video",
            f"{videos}/",  # as a user types a directory (it said `DIR//`)
        )
        assert result.returncode == 0, result.stderr[-3000:]
        files = sorted(videos.glob("*.mp4"))
        assert len(files) == 2 and all(
            re.fullmatch(rf"{algo}-painted-policy\d+-episode-{i}\.mp4", f.name) for i, f in enumerate(files)
        ), files
        for f in files:
            head = f.read_bytes()[:12]
            assert head[4:8] == b"ftyp", (f, head)  # an MP4 container
        assert f"recorded 2 episodes to {videos}/ (2 .mp4 files there)" in result.stdout

    @pytest.mark.skipif(not HAS_MOVIEPY, reason=NO_MOVIEPY)
    def test_video_of_cartpole_records_or_names_the_missing_renderer(self, runs, farm, tmp_path):
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

    @pytest.mark.skipif(
        not HAS_MOVIEPY or importlib.util.find_spec("pygame") is None,
        reason="CartPole's frames need pygame, the .mp4 files moviepy",
    )
    def test_video_prints_no_sdl_error_and_warns_only_of_videos_it_replaces(self, runs, farm, tmp_path):
        """pygame's SDL printed `error: XDG_RUNTIME_DIR is invalid` (no display, though nothing is shown) and
        gymnasium "Overwriting existing videos" for any folder that exists; a folder with this policy's
        videos is the one case to say something of, in one line."""
        env = {
            k: v
            for k, v in {**os.environ, **WORKER_ENV}.items()
            if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")
        }
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

    def test_video_without_moviepy_says_what_to_install(self, runs, farm, tmp_path):
        """A `moviepy` that cannot be imported (a stub first on the path) stands in for a missing one."""
        stub = tmp_path / "stub" / "moviepy"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("raise ImportError('No module named moviepy')\n")
        path = os.pathsep.join([str(stub.parent), WORKER_ENV["PYTHONPATH"]])
        result = run_cli(
            "eval", *source(runs, farm, "ppo", "policy"), "--video", str(tmp_path / "v"), env={"PYTHONPATH": path}
        )
        assert result.returncode == 1
        line = one_error_line(result.stderr)
        assert "--video needs moviepy" in line and 'pip install -e ".[video]"' in line
        assert not (tmp_path / "v").exists()

    def test_render_without_a_display_is_one_line(self, runs, farm):
        result = run_command(
            "eval", *source(runs, farm, "dqn", "policy"), "--render", env=_without_display(), timeout=600
        )
        assert result.returncode == 1
        line = one_error_line(result.stderr)
        assert "--render opens a window, but there is no display here" in line and "--video DIR" in line

    def test_render_on_a_display_that_is_not_there_fails_clearly(self, runs, farm):
        """DISPLAY set, but no X server behind it: without pygame, one line says what to install; with
        it (SDL then falls back to its offscreen driver and says so itself), that no window opened."""
        env = {**_without_display(), "DISPLAY": ":4321"}
        result = run_command("eval", *source(runs, farm, "ppo", "policy"), "--render", env=env, timeout=600)
        assert result.returncode == 1
        if importlib.util.find_spec("pygame") is None:
            line = one_error_line(result.stderr)
            assert 'pip install "gymnasium[classic-control]"' in line, line
        else:
            lines = [line for line in result.stderr.splitlines() if line.startswith("rlfarm:")]
            assert len(lines) == 1 and "--render could not open a window on DISPLAY=':4321'" in lines[0], result.stderr
            assert "Traceback" not in result.stderr

    def test_video_and_render_together_is_a_usage_error(self, tmp_path):
        result = run_cli("eval", "--policy", __file__, "--video", str(tmp_path / "v"), "--render")
        assert result.returncode == 2
        assert "give --video DIR (record) or --render (watch), not both" in one_error_line(result.stderr)

    # ---- `rlfarm eval RUN` (zoo's enjoy) and rlfarm.load of the runs' files ----------------------
    def test_eval_run_plays_its_best_policy_else_its_final_one(self, runs, tmp_path):
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

    def test_eval_run_takes_the_env_of_its_config(self, runs):
        """SAC's run: Pendulum, from config.json (a final policy file names no preprocessing)."""
        run_id, run_dir = runs["sac"]
        result = run_cli("eval", run_id, "--logdir", str(run_dir.parent), "--episodes", "1")
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1].startswith("Pendulum-v1, policy v")

    @pytest.mark.parametrize("algo", ["dqn", "ppo", "sac"])
    def test_load_acts_with_a_real_runs_final_policy(self, runs, algo):
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
