"""Recurrent policies on the masked-velocity envs (issue 53): sb3-contrib's RecurrentPPO with
rl-baselines3-zoo's tuned `ppo_lstm` settings, the reference an rlfarm recurrent learner is measured
against, on the envs rlfarm ships for it (rlfarm/cartpole_no_vel, the zoo's CartPoleNoVel-v1, and
rlfarm/pendulum_no_vel, its PendulumNoVel-v1: velocities at 0, so only a memory recovers them), and on
rlfarm/repeat_previous (POPGym's RepeatPreviousEasy), which neither the zoo nor POPGym tunes RecurrentPPO
for: there both sides take rlfarm's repeat-previous-lstm settings and network.

    pip install -e ".[bench]"
    python benchmarks/recurrent_sb3.py --env cartpole --seeds 1 2 3
    python benchmarks/recurrent_sb3.py --env pendulum --seeds 1 2 3
    python benchmarks/recurrent_sb3.py --env repeat --seeds 1 2 3 --stop-at-score

Per seed and side: the wall time (and env steps) from the start of learning until the mean return of
the last 20 training episodes first reaches the task's threshold (475 on CartPole, vs_sb3.py's "time to
solve"; Pendulum has none unless --threshold gives one), that mean at the end of the budget (the zoo's
n_timesteps, 1e5 on both), and the mean return of 20 greedy episodes on fresh seeds of the policy at
the budget. Learning runs the whole budget: the final figures need it. Every rollout's (env steps,
seconds, mean of the last 20 episodes) is kept as the curve. Results are one JSON file,
`<out>/<env>.json`, beside the printed table (`<out>/<env>.txt`); each side is one function of
(task, seed, threads) returning a run's record (SIDES), so rlfarm's recurrent learner joins as a
second one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's rlfarm (its shipped envs), as benchmarks run from it
WINDOW = 20  # training episodes a mean return is taken over (vs_sb3.py's)
GREEDY = 20  # fresh-seed greedy episodes scoring the policy at the budget (vs_sb3.py's TAKE_HOME)
GREEDY_SEED = 50_000
POLICY_KWARGS = {  # both tasks' (rl-baselines3-zoo hyperparams/ppo_lstm.yml); activation_fn: "ReLU"
    "ortho_init": False,
    "activation_fn": "ReLU",
    "lstm_hidden_size": 64,
    "enable_critic_lstm": True,
    "net_arch": {"pi": [64], "vf": [64]},
}


@dataclass(frozen=True)
class Task:
    env_id: str  # the shipped env
    zoo_id: str  # its name in rl-baselines3-zoo, whose settings are used
    budget: int  # env steps: the zoo's n_timesteps
    threshold: float | None  # the "time to score" target, None: none
    n_envs: int
    normalize: bool  # VecNormalize of observations and rewards, its gamma the run's (as the zoo does)
    # RecurrentPPO's arguments; "lin_X" is the zoo's linear schedule, from X to 0 over the budget.
    ppo: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None  # rlfarm's recurrent preset for the task (None: no rlfarm side yet)
    policy_kwargs: dict[str, Any] = field(default_factory=dict)  # over POLICY_KWARGS, for this task


# rl-baselines3-zoo hyperparams/ppo_lstm.yml (CartPoleNoVel-v1 "Tuned", PendulumNoVel-v1), copied:
# policy MlpLstmPolicy, normalize True; what they do not name is RecurrentPPO's default
# (Pendulum: batch_size 128; both: vf_coef 0.5, max_grad_norm 0.5).
TASKS = {
    "cartpole": Task(
        env_id="rlfarm/cartpole_no_vel",
        zoo_id="CartPoleNoVel-v1",
        budget=100_000,
        threshold=475.0,
        n_envs=8,
        normalize=True,
        ppo={
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
            "learning_rate": "lin_0.001",
            "clip_range": "lin_0.2",
        },
        preset="cartpole-no-vel-lstm",
    ),
    "pendulum": Task(
        env_id="rlfarm/pendulum_no_vel",
        zoo_id="PendulumNoVel-v1",
        budget=100_000,
        threshold=None,
        n_envs=4,
        normalize=True,
        ppo={
            "n_steps": 1024,
            "gae_lambda": 0.95,
            "gamma": 0.9,
            "n_epochs": 10,
            "ent_coef": 0.0,
            "learning_rate": 1e-3,
            "clip_range": 0.2,
            "use_sde": True,
            "sde_sample_freq": 4,
        },
        preset="pendulum-no-vel-lstm",
    ),
    # POPGym's RepeatPreviousEasy has no zoo entry: both sides take rlfarm's repeat-previous-lstm
    # settings (16 envs of 102 steps, 4 epochs of 4 minibatches, lr 1e-3, entropy 0.01, no
    # normalisation) and its network (one LSTM of 64 for actor and critic, tanh MLPs of 64 after it).
    "repeat": Task(
        env_id="rlfarm/repeat_previous",
        zoo_id="none: rlfarm's repeat-previous-lstm settings",
        budget=598_944,
        threshold=0.9,
        n_envs=16,
        normalize=False,
        ppo={
            "n_steps": 102,
            "batch_size": 408,
            "gae_lambda": 0.95,
            "gamma": 0.99,
            "n_epochs": 4,
            "ent_coef": 0.01,
            "learning_rate": 1e-3,
            "clip_range": 0.2,
        },
        preset="repeat-previous-lstm",
        policy_kwargs={
            "ortho_init": True,
            "activation_fn": "Tanh",
            "shared_lstm": True,
            "enable_critic_lstm": False,
        },
    ),
}


def _schedule(value: Any) -> Any:
    """The zoo's "lin_X": X times the fraction of the budget remaining (SB3's progress_remaining)."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def _mean(returns: deque[float]) -> float | None:
    """The mean of the last WINDOW returns, None before there are as many (JSON has no NaN)."""
    return sum(returns) / len(returns) if len(returns) == WINDOW else None


def _shown(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"  # (RepeatPrevious's returns are in [-1, 1])


def sb3_contrib_run(task: Task, seed: int, threads: int) -> dict[str, Any]:
    """One sb3-contrib RecurrentPPO run of `task`: its record (see the module)."""
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from rlfarm.envs import make_env

    torch.set_num_threads(threads)  # the other benchmarks' rule: a fixed share of the cores
    t_start = time.perf_counter()
    env = make_vec_env(lambda: make_env(task.env_id), n_envs=task.n_envs, seed=seed)
    if task.normalize:
        env = VecNormalize(env, gamma=task.ppo["gamma"])
    kwargs = {**POLICY_KWARGS, **task.policy_kwargs}
    policy_kwargs = {**kwargs, "activation_fn": getattr(torch.nn, kwargs["activation_fn"])}
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        **{k: _schedule(v) for k, v in task.ppo.items()},
        policy_kwargs=policy_kwargs,
        seed=seed,
        device="cpu",
        verbose=0,
    )

    class Score(BaseCallback):
        """Training episodes' returns (Monitor's, before VecNormalize): the first time the mean of the
        last WINDOW reaches the threshold, and the curve at every rollout's end."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=WINDOW)
            self.episodes = 0
            self.scored: tuple[float, int] | None = None
            self.curve: list[tuple[int, float, float | None]] = []

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
                    self.episodes += 1
            mean = _mean(self.returns)
            if self.scored is None and task.threshold is not None and mean is not None and mean >= task.threshold:
                self.scored = (time.perf_counter() - self.t0, self.num_timesteps)
            return not (STOP_AT_SCORE and self.scored)

        def _on_rollout_end(self) -> None:
            mean = _mean(self.returns)
            seconds = round(time.perf_counter() - self.t0, 2)
            self.curve.append((self.num_timesteps, seconds, None if mean is None else round(mean, 2)))

    score = Score()
    model.learn(total_timesteps=task.budget, callback=score)
    learn_seconds = time.perf_counter() - score.t0
    normalizer = env if task.normalize else None

    # The policy at the budget, greedy, its LSTM state carried through each episode and reset at its start.
    eval_env = make_env(task.env_id)
    greedy = []
    for episode in range(GREEDY):
        obs, _ = eval_env.reset(seed=GREEDY_SEED + episode)
        state, start, total, done = None, np.ones((1,), bool), 0.0, False
        while not done:
            seen = normalizer.normalize_obs(obs) if normalizer is not None else obs
            action, state = model.predict(seen[None], state=state, episode_start=start, deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action[0])
            start, total, done = np.zeros((1,), bool), total + float(reward), terminated or truncated
        greedy.append(total)
    return {
        "side": "sb3-contrib",
        "seed": seed,
        "seconds_to_score": score.scored[0] if score.scored else None,
        "steps_to_score": score.scored[1] if score.scored else None,
        "final_mean_return": _mean(score.returns),
        "greedy_mean_return": statistics.fmean(greedy),
        "episodes": score.episodes,
        "env_steps": model.num_timesteps,
        "learn_seconds": learn_seconds,
        "end_to_end_seconds": time.perf_counter() - t_start,
        "curve": score.curve,
    }


def rlfarm_run(task: Task, seed: int, threads: int) -> dict[str, Any]:
    """One `rlfarm train --preset <task.preset>` run on the embedded default (its Redis and local
    workers started and stopped within the run, all on this machine's cores), the same budget: its
    record from the run's episodes.csv (every training episode, with its env step and wall time since
    the run began), summary.json and `rlfarm eval` of its final policy on the greedy seeds."""
    import csv
    import subprocess
    import tempfile

    if task.preset is None:
        raise SystemExit(f"rlfarm has no recurrent preset for {task.env_id} yet: run with --sides sb3-contrib")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, str(ROOT / "cli.py"), "train", "--preset", task.preset, "--seed", str(seed)]
        # The whole budget, as sb3-contrib learns it (the preset would stop at its target): the time to
        # score is read from the episodes, the final figures are at the budget.
        stop = str(task.threshold) if STOP_AT_SCORE else "inf"
        command += ["--total-steps", str(task.budget), "--target-return", stop, "--logdir", tmp, "--run-id", "bench"]
        command += ["--workers", str(RLFARM_WORKERS), "--set", "eval.interval=0", "--set", f"torch_threads={threads}"]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        run_dir = Path(tmp) / "bench"
        returns: deque[float] = deque(maxlen=WINDOW)
        scored, episodes, curve = None, 0, []
        with open(run_dir / "episodes.csv") as f:
            for row in csv.DictReader(f):
                returns.append(float(row["episodic_return"]))
                episodes += 1
                mean = _mean(returns)
                point = (int(row["global_step"]), round(float(row["wall_time"]), 2))
                if scored is None and task.threshold is not None and mean is not None and mean >= task.threshold:
                    scored = (point[1], point[0])
                if not curve or point[0] - curve[-1][0] >= 5_000:  # a point every 5k steps or so
                    curve.append((*point, None if mean is None else round(mean, 2)))
        summary = json.loads((run_dir / "summary.json").read_text())
        greedy = subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "eval", "--policy", str(run_dir / "final_policy.safetensors")]
            + ["--episodes", str(GREEDY), "--seed", str(GREEDY_SEED)],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout
    return {
        "side": "rlfarm",
        "seed": seed,
        "seconds_to_score": scored[0] if scored else None,
        "steps_to_score": scored[1] if scored else None,
        "final_mean_return": _mean(returns),
        "greedy_mean_return": float(greedy.split("mean return ")[1].split()[0]),
        "episodes": episodes,
        "env_steps": summary["env_steps"],
        "learn_seconds": summary["wall_seconds"],
        "end_to_end_seconds": time.perf_counter() - t_start,
        "workers": RLFARM_WORKERS,
        "curve": curve,
    }


RLFARM_WORKERS = 1  # rlfarm's rollout processes beside its learner (--rlfarm-workers)
STOP_AT_SCORE = False  # --stop-at-score: each side stops learning once it scores (final figures then at that point)

# A side: (task, seed, torch threads) -> a run's record with at least the keys sb3_contrib_run returns.
SIDES: dict[str, Callable[[Task, int, int], dict[str, Any]]] = {"sb3-contrib": sb3_contrib_run, "rlfarm": rlfarm_run}


def _compact_lists(text: str) -> str:
    """Indented JSON with each innermost list on one line: a curve's points one a line, not a number a line."""
    return re.sub(
        r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text
    )


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for package in ("sb3-contrib", "stable-baselines3", "torch", "gymnasium", "numpy"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(TASKS), default="cartpole")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sides", nargs="+", choices=sorted(SIDES), default=sorted(SIDES))
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run [1]")
    parser.add_argument("--rlfarm-workers", type=int, default=1, help="rlfarm's rollout processes [1]")
    parser.add_argument("--threshold", type=float, help="the time-to-score target [the task's: CartPole 475]")
    parser.add_argument("--budget", type=int, help="env steps of each run [the zoo's n_timesteps]")
    parser.add_argument(
        "--stop-at-score", action="store_true", help="stop each run when it scores (the final figures are then there)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results" / f"recurrent-sb3-{datetime.date.today().isoformat()}",
        help="folder of <env>.json and <env>.txt [benchmarks/results/recurrent-sb3-<date>]",
    )
    args = parser.parse_args()
    global RLFARM_WORKERS, STOP_AT_SCORE
    RLFARM_WORKERS, STOP_AT_SCORE = args.rlfarm_workers, args.stop_at_score
    task = TASKS[args.env]
    changes = {"threshold": args.threshold} if args.threshold is not None else {}
    changes |= {"budget": args.budget} if args.budget is not None else {}
    task = Task(**{**task.__dict__, **changes})
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    target = f">= {task.threshold:g}" if task.threshold is not None else "(no threshold: none is timed)"
    say(
        f"{task.env_id} (rl-baselines3-zoo's {task.zoo_id}), budget {task.budget:,} env steps, cores {os.cpu_count()}, "
        f"torch threads {args.threads}; score: mean of the last {WINDOW} training episodes {target}"
    )
    say(f"{'side':<12} {'seed':>4} {'to score s':>10} {'steps':>7} {'final':>8} {'greedy':>8} {'learn s':>8}")
    runs = []
    for seed in args.seeds:
        for side in args.sides:
            run = SIDES[side](task, seed, args.threads)
            runs.append(run)
            say(
                f"{side:<12} {seed:>4} {_shown(run['seconds_to_score']):>10} {run['steps_to_score'] or '-':>7} "
                f"{_shown(run['final_mean_return']):>8} {_shown(run['greedy_mean_return']):>8} "
                f"{run['learn_seconds']:>8.1f}"
            )
    for side in args.sides:
        mine = [r for r in runs if r["side"] == side]
        # A run that never scored counts as infinitely slow, so the median stays honest (vs_sb3.py).
        times = [math.inf if r["seconds_to_score"] is None else r["seconds_to_score"] for r in mine]
        finals = [-math.inf if r["final_mean_return"] is None else r["final_mean_return"] for r in mine]
        timed = (
            f"median time to score {statistics.median(times):.1f} s (unscored runs "
            f"{sum(r['seconds_to_score'] is None for r in mine)} of {len(mine)}), "
            if task.threshold is not None
            else ""
        )
        say(
            f"{side}: {timed}median final mean return {_shown(statistics.median(finals))}, "
            f"greedy {_shown(statistics.median(r['greedy_mean_return'] for r in mine))}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "benchmarks/recurrent_sb3.py",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "env": args.env,
        "task": {
            **task.__dict__,
            "policy_kwargs": {**POLICY_KWARGS, **task.policy_kwargs},
            "window": WINDOW,
            "greedy_episodes": GREEDY,
            "stop_at_score": STOP_AT_SCORE,
        },
        "cores": os.cpu_count(),
        "torch_threads": args.threads,
        "versions": _versions(),
        "runs": runs,
    }
    (args.out / f"{args.env}.json").write_text(_compact_lists(json.dumps(record, indent=1)) + "\n")
    (args.out / f"{args.env}.txt").write_text("\n".join(lines) + "\n")
    print(f"written: {args.out / f'{args.env}.json'}, {args.out / f'{args.env}.txt'}")


if __name__ == "__main__":
    main()
