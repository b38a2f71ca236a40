"""SB3 PPO's Pong score after the env steps it would take in a given wall time on this machine: the
other half of docs/pong.md's learning proof ("SB3 PPO's score after the same wall time").

    pip install -e ".[atari,bench]"
    python benchmarks/pong.py --seconds 120        # prints SB3's env steps/s on this machine
    python benchmarks/pong_sb3.py --sps 246 --hours 2 --out runs/sb3-pong.csv

SB3's clock is its env steps, not its wall time: the budget is `--sps` (SB3's training throughput
measured by benchmarks/pong.py on the same machine, in the same sitting as rlfarm's) times `--hours`,
so the score it reaches does not depend on what else shares the cores while it runs. Settings are
rl-baselines3-zoo's PPO Atari ones (8 envs x 128 steps, 4 epochs of 256, lr 2.5e-4 and clip 0.1
annealed over the zoo's 10M steps, ent 0.01, vf 0.5), PongNoFrameskip-v4 with AtariWrapper and a
frame stack of 4: the deterministic Pong most reports use, and the one rlfarm's pong preset plays.
Every finished rollout appends (env steps, wall seconds, games, mean of the last 20 games) to `--out`.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sps", type=float, required=True, help="SB3's env steps/s measured by benchmarks/pong.py")
    parser.add_argument("--hours", type=float, default=2.0, help="wall time whose env steps SB3 gets")
    parser.add_argument("--out", default="runs/sb3-pong.csv", help="CSV of the curve")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    torch.set_num_threads(os.cpu_count() or 1)
    budget = int(args.sps * args.hours * 3600)
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=args.seed), n_stack=4)
    zoo_steps = 10_000_000  # the zoo's n_timesteps for Atari: the schedules anneal over it

    def linear(start: float):
        # SB3 passes the fraction of total_timesteps remaining; total_timesteps here is the budget
        return lambda remaining: start * (1 - (1 - remaining) * budget / zoo_steps)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out = open(args.out, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(["env_steps", "wall_seconds", "games", "mean_last_20"])

    class Curve(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()
            self.games: collections.deque[float] = collections.deque(maxlen=20)
            self.count = 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.games.append(info["episode"]["r"])
                    self.count += 1
            return True

        def _on_rollout_end(self) -> None:
            mean = sum(self.games) / len(self.games) if self.games else float("nan")
            writer.writerow(
                [self.num_timesteps, round(time.perf_counter() - self.start, 1), self.count, round(mean, 2)]
            )
            out.flush()

    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        vf_coef=0.5,
        ent_coef=0.01,
        verbose=0,
        seed=args.seed,
        device="cpu",
    )
    model.learn(total_timesteps=budget, callback=Curve())
    out.close()
    print(f"SB3 PPO, {budget:,} env steps ({args.hours:g} h at {args.sps:g} env steps/s): curve in {args.out}")


if __name__ == "__main__":
    main()
