"""Wall-clock until CartPole-v1 is solved: rlfarm against Stable-Baselines3, in one run.

    pip install -e ".[bench]"
    python benchmarks/vs_sb3.py --algo ppo --seeds 1 2 3
    python benchmarks/vs_sb3.py --algo dqn --seeds 1 2 3

PPO: "solved" when the mean return of the last 20 training episodes reaches 475; rlfarm SYNC PPO
(preset cartpole-ppo) against SB3 PPO. DQN: "solved" when a greedy evaluation (10 episodes, every
5,000 env steps) reaches 495 and 20 more episodes with other seeds agree, the cartpole-dqn preset's
stop rule (stopping at a confirmed 475 left policies that scored 458-464 on fresh seeds in 3 of 20
runs); rlfarm ASYNC DQN against SB3 DQN, whose clock is paused while it evaluates (rlfarm
evaluates on the workers, off the training path). What each side leaves behind is then scored on
20 fresh-seed greedy episodes ("home"; the goal is >= 475).

Both sides are timed from the start of learning (SB3: model.learn(); rlfarm: the trainer loop, after
its embedded Redis and 2 worker processes are up). End-to-end times (process start to finish,
including rlfarm's cluster start-up) are printed too. SB3 uses rl-baselines3-zoo's tuned CartPole-v1
hyper-parameters.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

THRESHOLD = 475.0
DQN_TARGET = 495.0  # the cartpole-dqn preset's target_return, applied to both sides
WINDOW = 20
CONFIRM = 20  # episodes confirming an evaluation at the threshold (rlfarm: eval.confirm_episodes)
TAKE_HOME = 20  # fresh-seed greedy episodes scoring the policy a run leaves behind
ROOT = Path(__file__).resolve().parents[1]


def _learn_until_solved(model, callback, max_steps: int, t_start: float) -> tuple[float, int, float]:
    """(seconds of learning until solved or nan, env steps, seconds end to end) of an SB3 model."""
    model.learn(total_timesteps=max_steps, callback=callback)
    if callback.solved_at is None:
        return float("nan"), max_steps, time.perf_counter() - t_start
    return callback.solved_at[0], callback.solved_at[1], time.perf_counter() - t_start


def sb3_time_to_solve(seed: int, max_steps: int = 200_000) -> tuple[float, int, float]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    t_start = time.perf_counter()

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(0.001),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )

    class Solved(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns: deque[float] = deque(maxlen=WINDOW)
            self.solved_at: tuple[float, int] | None = None

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            if len(self.returns) == WINDOW and sum(self.returns) / WINDOW >= THRESHOLD:
                self.solved_at = (time.perf_counter() - self.t0, self.num_timesteps)
                return False
            return True

    return _learn_until_solved(model, Solved(), max_steps, t_start)


def sb3_dqn_time_to_solve(seed: int, max_steps: int = 100_000, eval_every: int = 5_000) -> tuple[float, int, float]:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DQN

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    # rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    eval_env = gym.make("CartPole-v1")
    callback = greedy_eval_callback(eval_env, eval_every, DQN_TARGET)
    result = _learn_until_solved(model, callback, max_steps, t_start)
    # What a user takes home: the model as it stopped, on fresh seeds.
    return (*result, float(np.mean(greedy_returns(model, eval_env, TAKE_HOME, 50_000))))


def greedy_returns(model, env, episodes: int, first_seed: int) -> list[float]:
    """Returns of `episodes` greedy episodes of an SB3 model on `env`, seeded first_seed, +1, ..."""
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=first_seed + episode)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(action)
            total, done = total + float(r), term or trunc
        returns.append(total)
    return returns


def greedy_eval_callback(eval_env, eval_every: int, target: float):
    """An SB3 callback that stops learning once a greedy evaluation (10 episodes, every `eval_every`
    env steps) reaches `target` and CONFIRM more episodes with other seeds agree, the rule rlfarm's
    runs use (eval.confirm_episodes: one lucky evaluation cannot stop a run). Its clock pauses while
    it evaluates (rlfarm evaluates on the workers, off the training path); `solved_at` is (seconds of
    learning, env steps) or None."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class GreedyEval(BaseCallback):
        def __init__(self):
            super().__init__()
            self.solved_at: tuple[float, int] | None = None
            self.paused, self.next_eval = 0.0, eval_every

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += eval_every
            t = time.perf_counter()
            solved = (
                np.mean(greedy_returns(self.model, eval_env, 10, 10_000)) >= target
                and np.mean(greedy_returns(self.model, eval_env, CONFIRM, 20_000)) >= target
            )
            self.paused += time.perf_counter() - t
            if solved:
                self.solved_at = (time.perf_counter() - self.t0 - self.paused, self.num_timesteps)
            return not solved

    return GreedyEval()


def rlfarm_time_to_solve(
    seed: int, workers: int, algo: str = "ppo", preset: str | None = None, extra: tuple[str, ...] = ()
) -> tuple[float, int, float]:
    """(seconds of learning until solved or nan, env steps, seconds end to end) of an rlfarm run of
    `preset` (default cartpole-<algo>) with `extra` CLI arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "train",
                "--preset",
                preset or f"cartpole-{algo}",
                "--workers",
                str(workers),
                "--seed",
                str(seed),
                "--target-return",
                str(DQN_TARGET if algo == "dqn" else THRESHOLD),
                # PPO is solved by its rolling training return: no scheduled evaluation judges it.
                *([] if algo == "dqn" else ["--set", "eval.interval=0"]),
                "--logdir",
                tmp,
                "--run-id",
                "bench",
                *extra,
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        end_to_end = time.perf_counter() - t
        if algo == "dqn":  # solved when a greedy evaluation >= threshold was confirmed (summary.json)
            summary = json.loads((Path(tmp) / "bench" / "summary.json").read_text())
            at = summary["target_reached_at"]
            home = _rlfarm_take_home(Path(tmp) / "bench" / "best_policy.safetensors")
            if at is None:
                return float("nan"), -1, end_to_end, home
            return at["wall_seconds"], int(at["env_steps"]), end_to_end, home
        seconds, steps, _ = rolling_solve(Path(tmp) / "bench" / "episodes.csv")
        return seconds, steps, end_to_end  # nan, -1: not solved within the preset's total_steps


def rolling_solve(episodes_csv: Path) -> tuple[float, int, float]:
    """From an rlfarm run's episodes.csv: (wall time, env steps) when the mean of the last WINDOW
    episodes first reached THRESHOLD ((nan, -1) if never), and the best such mean."""
    returns: deque[float] = deque(maxlen=WINDOW)
    solved, best = (float("nan"), -1), -math.inf
    with open(episodes_csv) as f:
        for row in csv.DictReader(f):
            returns.append(float(row["episodic_return"]))
            if len(returns) == WINDOW:
                best = max(best, sum(returns) / WINDOW)
                if best >= THRESHOLD and solved[1] < 0:
                    solved = (float(row["wall_time"]), int(row["global_step"]))
    return solved[0], solved[1], best


def _rlfarm_take_home(policy: Path) -> float:
    """Mean return of the policy a user takes home (best_policy.safetensors) over TAKE_HOME greedy
    episodes on fresh seeds, with `rlfarm eval`."""
    if not policy.exists():
        return float("nan")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "eval",
            "--policy",
            str(policy),
            "--episodes",
            str(TAKE_HOME),
            "--seed",
            "50000",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return float(out.split("mean return ")[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--algo", choices=["ppo", "dqn"], default="ppo")
    args = parser.parse_args()
    rows = []
    what = (
        f"mean of last {WINDOW} training episodes >= {THRESHOLD:g}"
        if args.algo == "ppo"
        else f"greedy evaluation over 10 episodes, confirmed by {CONFIRM} more with other seeds, >= {DQN_TARGET:g}"
    )
    print(f"{args.algo.upper()}, cores: {os.cpu_count()}; threshold: {what}")
    home = f" {'home':>6} {'home':>6}" if args.algo == "dqn" else ""
    print(
        f"{'seed':>4} {'rlfarm s':>9} {'steps':>7} {'e2e s':>7} {'SB3 s':>7} {'steps':>7} {'e2e s':>7} "
        f"{'ratio':>6}{home}"
    )
    for seed in args.seeds:
        r = rlfarm_time_to_solve(seed, args.workers, args.algo)
        s = sb3_time_to_solve(seed) if args.algo == "ppo" else sb3_dqn_time_to_solve(seed)
        rows.append((r, s))
        # DQN: "home" is the mean return over 20 fresh-seed greedy episodes of the policy each side
        # leaves behind (rlfarm: best_policy.safetensors; SB3: the model when it stopped).
        home = f" {r[3]:>6.1f} {s[3]:>6.1f}" if args.algo == "dqn" else ""
        print(
            f"{seed:>4} {r[0]:>9.1f} {r[1]:>7} {r[2]:>7.1f} {s[0]:>7.1f} {s[1]:>7} {s[2]:>7.1f} "
            f"{r[0] / s[0]:>6.2f}{home}",
            flush=True,
        )
    # An unsolved run counts as infinitely slow, so medians stay honest.
    med = lambda xs: statistics.median(math.inf if math.isnan(x) else x for x in xs)  # noqa: E731
    med_r, med_s = med(r[0] for r, _ in rows), med(s[0] for _, s in rows)
    med_re, med_se = med(r[2] for r, _ in rows), med(s[2] for _, s in rows)
    unsolved = sum(math.isnan(r[0]) for r, _ in rows), sum(math.isnan(s[0]) for _, s in rows)
    print(
        f"median time to solve: rlfarm {med_r:.1f} s, SB3 {med_s:.1f} s -> ratio {med_r / med_s:.2f}x "
        f"(end to end incl. rlfarm's cluster start-up: {med_re / med_se:.2f}x); "
        f"unsolved runs: rlfarm {unsolved[0]}, SB3 {unsolved[1]}"
    )


if __name__ == "__main__":
    main()
