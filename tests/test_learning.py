"""Learning and reproducibility, end to end through the CLI on the embedded default."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json

import pytest

from rlfarm.core import codec

from .conftest import assert_cleaned_up, run_cli

NO_MPE2 = 'mpe2 is not installed (pip install -e ".[multiagent]")'

# One learning run at a time, ahead of the rest of the parallel suite (tests/conftest.py: LEARNING_GROUP).
pytestmark = pytest.mark.learning


def train_embedded(tmp_path, run_id, *args):
    result = run_cli("train", "--run-id", run_id, "--logdir", str(tmp_path), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / run_id
    assert len(json.loads((run_dir / "cluster.json").read_text())["pids"]) >= 2  # its Redis and workers
    assert_cleaned_up(run_dir, run_id)
    return run_dir


def take_home(run_dir, policy: str = "final_policy.safetensors", episodes: int = 20) -> float:
    """What a user takes home, judged on seeds the run never saw: `rlfarm eval` of the saved policy
    (the one the run ended with, or its best), greedy, its mean return."""
    home = run_cli("eval", "--policy", str(run_dir / policy), "--episodes", str(episodes), "--seed", "777")
    assert home.returncode == 0, home.stderr
    mean = float(home.stdout.split("mean return ")[1].split()[0])
    print(f"{run_dir.name}: {policy} over {episodes} fresh greedy episodes = {mean:.1f}")
    return mean


@pytest.mark.deterministic
def test_cartpole_ppo_solves_within_100k_steps(tmp_path):
    """The policy the 102,400-step run ends with balances the pole on fresh seeds."""
    run_dir = train_embedded(tmp_path, "cartpole", "--preset", "cartpole-ppo", "--workers", "2")
    assert take_home(run_dir) >= 475


@pytest.mark.deterministic
def test_pendulum_ppo_learns_within_200k_steps(tmp_path):
    run_dir = train_embedded(tmp_path, "pendulum", "--preset", "pendulum-ppo", "--workers", "2")
    assert take_home(run_dir) >= -250  # random play is about -1200


def test_cartpole_dqn_async_greedy_eval_reaches_475_within_100k_steps(tmp_path):
    run_dir = train_embedded(tmp_path, "cartpole-dqn", "--preset", "cartpole-dqn", "--mode", "async", "--workers", "2")
    with open(run_dir / "evals.csv") as f:
        evals = [r for r in csv.DictReader(f) if int(r["global_step"]) <= 100_000]
    assert evals and all(int(r["episodes"]) >= 10 for r in evals)
    best = max(float(r["mean_return"]) for r in evals)
    print(f"cartpole-dqn: best greedy evaluation within 100k steps = {best:.1f}")
    assert best >= 475
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["unique_task_ids_accepted"] == summary["task_ids_accepted"]
    # The policy a user takes home is the one that reached the target, confirmed on other seeds:
    # rlfarm eval of best_policy.safetensors on fresh seeds agrees. Over 50 episodes: a greedy DQN
    # policy can drop the pole from a rare start (a CI run's 10 episodes fell 262 steps short of 5,000
    # in all: mean 473.8); the claim is about its mean return, which 10 episodes measured too coarsely.
    assert summary["target_reached"] and summary["best_version"] is not None
    assert take_home(run_dir, "best_policy.safetensors", episodes=50) >= 475


# The SAC and TD3 tests run their presets with 64x64 networks instead of 256x256 and 400x300: the
# learner's matrix products were most of the suite's CPU (TD3's 400x300 about 15 ms a gradient step on
# one of these cores), and the claim tested, that the farm's ASYNC off-policy learner reaches the
# target within the zoo's budget, holds for them too (seeds 1-5: SAC confirmed at 3.4k-6.6k env
# steps, TD3 at 16.4k-17.6k, of 20k). The presets' own figures, with their networks, are measured by
# `rlfarm train --preset pendulum-td3 --seeds 1-5` (docs/configuration.md).
SMALL_NETWORKS = ("--set", "policy.hidden_sizes=[64,64]")


def test_pendulum_sac_async_confirmed_greedy_eval_reaches_minus_250_within_20k_steps(tmp_path):
    """rl-baselines3-zoo's SAC scores about -176 on Pendulum-v1 at 20k steps; on the farm a greedy
    evaluation of -250 or better, confirmed on 20 more episodes, comes within the same 20k."""
    run_dir = train_embedded(
        tmp_path, "pendulum-sac", "--preset", "pendulum-sac", "--mode", "async", "--seed", "1", *SMALL_NETWORKS
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    reached = summary["target_reached_at"]
    print(f"pendulum-sac: target -250 confirmed at {reached}")
    assert summary["target_reached"] and reached["env_steps"] <= 20_000
    with open(run_dir / "evals.csv") as f:
        evals = list(csv.DictReader(f))
    confirmed = [r for r in evals if r["confirmation"] == "1" and float(r["mean_return"]) >= -250]
    assert confirmed and int(confirmed[0]["global_step"]) <= 20_000
    assert summary["dropped_stale"] == 0  # off-policy: no result was thrown away for its lag


def test_pendulum_td3_async_confirmed_greedy_eval_reaches_minus_200_within_20k_steps(tmp_path):
    """rl-baselines3-zoo's TD3 settings on Pendulum-v1 (10k steps of uniform heatup, then one gradient
    step per env step): a greedy evaluation of -200 or better, confirmed on 50 more episodes, within
    20k env steps; `rlfarm eval` of best_policy.safetensors scores -250 or better on 30 fresh seeds."""
    run_dir = train_embedded(tmp_path, "pendulum-td3", "--preset", "pendulum-td3", "--seed", "1", *SMALL_NETWORKS)
    summary = json.loads((run_dir / "summary.json").read_text())
    reached = summary["target_reached_at"]
    print(f"pendulum-td3: target -200 confirmed at {reached}")
    assert summary["target_reached"] and reached["env_steps"] <= 20_000
    with open(run_dir / "evals.csv") as f:
        evals = list(csv.DictReader(f))
    confirmed = [r for r in evals if r["confirmation"] == "1" and float(r["mean_return"]) >= -200]
    assert confirmed and int(confirmed[0]["global_step"]) <= 20_000
    assert summary["dropped_stale"] == 0  # off-policy: no result was thrown away for its lag
    assert take_home(run_dir, "best_policy.safetensors", episodes=30) >= -250


@pytest.mark.deterministic
@pytest.mark.parametrize(("episodes", "recurrent"), [("fresh", ""), ("continue", ""), ("continue", "lstm")])
def test_same_seed_same_policy_with_1_and_3_workers(tmp_path, episodes, recurrent):
    """SYNC learns the same policy bytes whatever the farm's size, with fresh episodes in every task
    and with env streams going on across tasks (their snapshots move them between processes), a
    recurrent policy's memory with them (issue 53: sequences of 64 steps, 4 a task)."""
    digests = []
    memory = ["--set", f"policy.recurrent={recurrent}", "--set", "policy.seq_len=64"] if recurrent else []
    for workers in ("1", "3"):
        run_dir = train_embedded(
            tmp_path / f"w{workers}",
            f"repro-{episodes}{recurrent}",  # not another test's run id: they run at once, and their workers' names
            "--workers",  # tell whether a run left one behind (assert_cleaned_up)
            workers,
            "--seed",
            "5",
            "--total-steps",
            "16384",
            "--set",
            "farm.num_tasks=6",
            "--set",
            "farm.steps_per_env=256",
            "--set",
            "env.num_envs=2",
            "--set",
            "ppo.num_minibatches=4",
            "--set",
            f"farm.episodes={episodes}",
            *memory,
        )
        summary = json.loads((run_dir / "summary.json").read_text())
        # sha256 over every tensor's raw bytes (the safetensors header orders metadata arbitrarily,
        # so the file itself is not canonical; the weights are).
        state, meta = codec.decode_policy((run_dir / "final_policy.safetensors").read_bytes())
        raw = hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()
        digests.append((summary["policy_sha256"], meta["sha256"], raw, summary["final_version"]))
        if episodes == "continue":  # 6 streams of 2 CartPole envs, none restarted
            streams = summary["streams"]
            assert streams["count"] == 6 and streams["tasks"] == 36 and streams["restarted"] == 0
            if workers == "1":  # one process holds every stream: nothing to restore
                assert streams["moved"] == 0
            # (3 processes: whether a stream moves depends on scheduling; tests/test_snapshot.py shows
            # a moved stream goes on bit for bit, test_faults.py that a killed process's streams do.)
            print(f"continue, {workers} worker processes: {streams}")
    assert digests[0] == digests[1]
    assert digests[0][3] == 6  # 16384 / (6 x 2 x 256) = 5.33, rounded up to 6 iterations, one version each


def test_async_ppo_as_typed_reaches_475_within_150k_steps(tmp_path):
    """`rlfarm train --mode async`, no preset: APPO on CartPole on the embedded default; its run's
    best policy (chosen by its greedy evaluations) holds on fresh seeds."""
    run_dir = train_embedded(tmp_path, "appo", "--mode", "async", "--seed", "1")
    assert take_home(run_dir, "best_policy.safetensors") >= 475


def test_appo_at_high_lag_corrects_with_vtrace_and_learns(tmp_path):
    """8 tasks in flight on 2 workers and a version per result: results act with versions several
    updates old; V-trace's weights show it (mean below 1, some clipped) and the policy still learns."""
    run_dir = train_embedded(
        tmp_path,
        "appo-lag",
        "--preset",
        "cartpole-appo",
        "--seed",
        "1",
        "--total-steps",
        "102400",
        "--set",
        "async.tasks_in_flight=8",
        "--set",
        "async.results_per_update=1",
        "--set",
        "async.refresh_steps=0",
    )  # tasks act with the version they started with
    with open(run_dir / "progress.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["vtrace/rho_mean"] != "nan"]
    assert max(int(r["farm/policy_lag_max"]) for r in rows) >= 2
    assert min(float(r["vtrace/rho_mean"]) for r in rows) < 0.99
    assert max(float(r["vtrace/rho_clipped_frac"]) for r in rows) > 0.0
    assert take_home(run_dir, "best_policy.safetensors") >= 450


def _policy_digest(run_dir) -> str:
    state, _ = codec.decode_policy((run_dir / "final_policy.safetensors").read_bytes())
    return hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()


@pytest.mark.deterministic
@pytest.mark.skipif(importlib.util.find_spec("mpe2") is None, reason=NO_MPE2)
def test_spread_ppo_one_policy_for_three_agents_learns_to_cover_the_landmarks(tmp_path):
    """mpe2's simple_spread_v3, preset spread-ppo: 3 agents, one shared policy, SYNC PPO. Greedy games
    score about -28 acting at random and -26 standing still; within 192k agent steps (40% of the
    preset's run: its games cost most of a run's CPU, on the workers) a greedy evaluation of 50 games
    reaches -23 or better (seeds 1-5: docs/multiagent.md)."""
    run_dir = train_embedded(
        tmp_path,
        "spread",
        "--preset",
        "spread-ppo",
        "--seed",
        "1",
        "--total-steps",
        "192000",
        "--set",
        "eval.episodes=50",
    )
    with open(run_dir / "evals.csv") as f:
        evals = list(csv.DictReader(f))
    assert len(evals) == 2 and all(int(r["episodes"]) == 50 for r in evals)  # at 96k and 192k
    best = max(float(r["mean_return"]) for r in evals)
    print(f"spread-ppo: best greedy evaluation = {best:.2f} ({[round(float(r['mean_return']), 1) for r in evals]})")
    assert best >= -23.0
    with open(run_dir / "episodes.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) > 0  # per-agent training episodes are reported


@pytest.mark.deterministic
@pytest.mark.skipif(importlib.util.find_spec("mpe2") is None, reason=NO_MPE2)
@pytest.mark.parametrize(
    "preset, steps, tasks, agents",
    [
        ("spread-ppo", 14400, 6, 6),  # agents are sub-envs (rlfarm.envs.agents): one shared policy
        ("tag-ppo", 9600, 3, 8),  # predators and prey, a learner each (env.policy_map, rlfarm.algos.group)
    ],
)
def test_a_multi_agent_sync_run_learns_the_same_bytes_with_1_and_3_workers(tmp_path, preset, steps, tasks, agents):
    """A SYNC run on a multi-agent env, one policy or several, is as reproducible as any."""
    digests = []
    for workers in ("1", "3"):
        sets = [f"farm.num_tasks={tasks}", f"env.num_envs={agents}", "farm.steps_per_env=100"]
        sets += ["eval.interval=0", "eval.episodes=2"]
        options = [part for value in sets for part in ("--set", value)]
        run_dir = train_embedded(
            tmp_path / f"w{workers}",
            f"repro-{preset}",  # its own run id, as above
            "--preset",
            preset,
            "--workers",
            workers,
            "--total-steps",
            str(steps),
            *options,
        )
        summary = json.loads((run_dir / "summary.json").read_text())
        digests.append((_policy_digest(run_dir), summary["final_version"], summary["env_steps"]))
    assert digests[0] == digests[1]
    assert digests[0][1:] == (4, steps)  # 4 iterations of `tasks` tasks x `agents` agents x 100 steps


@pytest.mark.deterministic
def test_four_rooms_two_levels_reach_the_goal_in_90_percent_of_greedy_episodes(tmp_path):
    """rlfarm/four_rooms_two_level, preset four-rooms-two-level: an upper policy picks subgoals, a lower
    one walks there, each with its learner (env.policy_map); the run stops once 90 of 100 greedy
    episodes reach the goal (seeds 1-5 did within 491k-655k agent steps of the preset's 1.6M:
    docs/multiagent.md)."""
    run_dir = train_embedded(tmp_path, "rooms", "--preset", "four-rooms-two-level", "--seed", "1")
    with open(run_dir / "evals.csv") as f:
        evals = [float(r["mean_return"]) for r in csv.DictReader(f)]
    print(f"four-rooms-two-level: greedy evaluations {evals}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target_reached"] and max(evals) >= 0.9
    assert summary["env_steps"] < 1_638_400  # stopped at the target, inside the preset's budget


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_an_lstm_balances_the_pole_it_cannot_see_move_within_100k_steps(tmp_path, seed):
    """cartpole-no-vel-lstm (issue 53): CartPole with its velocities masked, which only a memory can
    recover. The mean of the last 20 training episodes reaches 475 within the 100k budget (seeds 1-8
    in-process: 38k-77k steps); the policy it stopped with, greedy on fresh seeds, balances the pole
    far longer than any feed-forward policy does on it (the control below: a best rolling mean of 64)."""
    run_dir = train_embedded(
        tmp_path, f"novel-lstm-{seed}", "--preset", "cartpole-no-vel-lstm", "--seed", str(seed), "--workers", "1"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"cartpole-no-vel-lstm seed {seed}: 475 at {summary['target_reached_at']}")
    assert summary["target_reached"] and summary["target_reached_at"]["env_steps"] <= 100_352
    home = take_home(run_dir)
    print(f"cartpole-no-vel-lstm seed {seed}: final policy greedy on fresh seeds {home:.1f}")
    assert home >= 200


def test_without_memory_the_pole_it_cannot_see_move_falls(tmp_path):
    """The negative control: the same preset with a feed-forward policy (policy.recurrent = "") sees
    positions only; its rolling mean stays far below 475 for the whole budget."""
    run_dir = train_embedded(
        tmp_path, "novel-ff", "--preset", "cartpole-no-vel-lstm", "--workers", "1", "--set", "policy.recurrent="
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"cartpole-no-vel-lstm without memory: best rolling mean {summary['best_rolling_return']:.1f}")
    assert not summary["target_reached"] and summary["best_rolling_return"] < 200


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_recurrent_appo_balances_the_pole_it_cannot_see_move_from_lagged_results(tmp_path, seed):
    """cartpole-no-vel-lstm-appo (issue 53): the LSTM learned ASYNC from results up to 8 versions
    old, V-trace over sequences replayed from the states their tasks recorded. A greedy evaluation
    reaches 475, confirmed by 20 more episodes, within the preset's 200k env steps (25 runs of seeds
    1-5 on 2 workers, alone and beside two busy processes: 33k-72k; one run under CI load had not by
    100k), and the best policy holds on fresh seeds (462-500 there; benchmarks/recurrent_appo.py)."""
    run_dir = train_embedded(
        tmp_path, f"novel-appo-{seed}", "--preset", "cartpole-no-vel-lstm-appo", "--seed", str(seed), "--workers", "2"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"cartpole-no-vel-lstm-appo seed {seed}: 475 at {summary['target_reached_at']}")
    assert max(int(lag) for lag in summary["policy_lag_histogram"]) >= 2  # it learned from lagged results
    assert summary["target_reached"] and summary["target_reached_at"]["env_steps"] <= 200_704
    assert take_home(run_dir, "best_policy.safetensors") >= 400


@pytest.mark.parametrize("seed", [1, 4])
def test_an_lstm_swings_up_the_pendulum_whose_speed_it_cannot_see(tmp_path, seed):
    """pendulum-no-vel-lstm (issue 53): Pendulum with its angular velocity masked, a Gaussian policy
    with an LSTM, sequences of whole episodes. Within 102,400 env steps the mean of the last 20
    training episodes is -230 to -158 and the final policy's greedy return -217 to -118 for seeds 1-5
    on the farm (random: about -1200); without its LSTM the same preset stays at random's level."""
    run_dir = train_embedded(
        tmp_path, f"pend-lstm-{seed}", "--preset", "pendulum-no-vel-lstm", "--seed", str(seed), "--workers", "1"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    home = take_home(run_dir)
    print(f"pendulum-no-vel-lstm seed {seed}: rolling {summary['rolling_return']:.1f}, greedy {home:.1f}")
    assert summary["rolling_return"] >= -400 and home >= -400


def test_without_memory_the_pendulum_whose_speed_it_cannot_see_stays_down(tmp_path):
    run_dir = train_embedded(
        tmp_path, "pend-ff", "--preset", "pendulum-no-vel-lstm", "--workers", "1", "--set", "policy.recurrent="
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"pendulum-no-vel-lstm without memory: best rolling mean {summary['best_rolling_return']:.1f}")
    assert summary["best_rolling_return"] < -800


NO_POPGYM = 'popgym is not installed (pip install -e ".[memory]")'


@pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason=NO_POPGYM)
@pytest.mark.parametrize("seed", [1, 2])
def test_an_lstm_repeats_the_suit_of_the_card_four_steps_back(tmp_path, seed):
    """repeat-previous-lstm (issue 53): POPGym's RepeatPreviousEasy, which only a memory of the last 4
    cards answers. The mean of the last 20 episodes reaches 0.9 (95% of answers right) within the
    598,944-step budget (seeds 1-5 in-process at 313k-392k steps), and the policy it stopped with,
    greedy on fresh seeds, scores 0.9 or more."""
    run_dir = train_embedded(
        tmp_path, f"repeat-{seed}", "--preset", "repeat-previous-lstm", "--seed", str(seed), "--workers", "1"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    home = take_home(run_dir)
    print(f"repeat-previous-lstm seed {seed}: 0.9 at {summary['target_reached_at']}, greedy {home:.3f}")
    assert summary["target_reached"] and home >= 0.9


@pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason=NO_POPGYM)
def test_without_memory_no_suit_four_steps_back_is_named(tmp_path):
    """The negative control: the same preset feed-forward sees the card just dealt; whatever it
    learns, it names the suit of a card 4 steps back no better than chance (one answer in four right:
    a return of about -0.5; seed 1's best rolling mean -0.41)."""
    run_dir = train_embedded(
        tmp_path, "repeat-ff", "--preset", "repeat-previous-lstm", "--workers", "1", "--set", "policy.recurrent="
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"repeat-previous-lstm without memory: best rolling mean {summary['best_rolling_return']:.3f}")
    assert not summary["target_reached"] and summary["best_rolling_return"] < 0.3
