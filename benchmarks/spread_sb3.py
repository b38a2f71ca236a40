"""Cooperative navigation (mpe2's simple_spread_v3, 3 agents, one shared policy): rlfarm against
Stable-Baselines3 PPO over SuperSuit's vector env of agents, the usual peer set-up, in one run.

    pip install -e ".[bench,multiagent]"
    python benchmarks/spread_sb3.py --seeds 1 2 3

Both sides train one policy for every agent (parameter sharing) on the same agent steps (env steps
counted per agent, as SuperSuit's vector env counts them) with the same PPO settings, the preset
spread-ppo's: rlfarm SYNC PPO on the embedded default with 2 worker processes, SB3 PPO on one
process (8 games x 3 agents, n_steps 100, the same batch, epochs, minibatches, learning rate, entropy
bonus). Both are then scored by the same evaluator: 50 greedy games on fresh seeds
(rlfarm.core.rollout.run_episodes, a game's return the mean of its agents'), and timed from the
start of learning (SB3: model.learn(); rlfarm: the trainer's loop, after its Redis and workers are
up) and end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = "spread-ppo"
EVAL_GAMES = 50
EVAL_SEED = 90_000


def preset() -> dict:
    """The preset's values by dotted key, every key filled in (defaults where the preset is silent)."""
    sys.path.insert(0, str(ROOT))
    from rlfarm.api import make_config
    from rlfarm.config import flatten, to_dict

    return flatten(to_dict(make_config(PRESET)))


def evaluate(act) -> float:
    """Mean return of EVAL_GAMES greedy games of simple_spread_v3 with `act(obs) -> actions`."""
    import numpy as np

    from rlfarm.core.rollout import run_episodes
    from rlfarm.envs import describe, make_env

    class Greedy:
        spec = describe("mpe2/simple_spread_v3")

        def act(self, obs, rng, deterministic=True):
            n = len(obs)
            return np.asarray(act(obs), np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32)

    return float(np.mean(run_episodes(Greedy(), make_env("mpe2/simple_spread_v3"), EVAL_GAMES, EVAL_SEED)))


def sb3_run(seed: int, total_steps: int, p: dict) -> dict:
    import supersuit as ss
    import torch
    from mpe2 import simple_spread_v3
    from stable_baselines3 import PPO
    from supersuit.vector import ConcatVecEnv

    if not hasattr(ConcatVecEnv, "seed"):  # SuperSuit 3.11's vector env lost it, and SB3 seeds the env with it
        ConcatVecEnv.seed = lambda self, seed=None: self.reset(seed=seed)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    games = p["env.num_envs"] // 3
    env = ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env(continuous_actions=False))
    env = ss.concat_vec_envs_v1(env, games, num_cpus=0, base_class="stable_baselines3")
    # rlfarm's batch is tasks x envs x steps; SB3's is n_steps x envs: the same with n_steps = tasks x steps.
    n_steps = p["farm.steps_per_env"] * p["farm.num_tasks"]
    batch = n_steps * p["env.num_envs"]
    lr = p["ppo.learning_rate"]
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=n_steps,
        batch_size=batch // p["ppo.num_minibatches"],
        n_epochs=p["ppo.update_epochs"],
        learning_rate=(lambda remaining: remaining * lr) if p["ppo.anneal_lr"] else lr,
        gamma=p["ppo.gamma"],
        gae_lambda=p["ppo.gae_lambda"],
        clip_range=p["ppo.clip_coef"],
        ent_coef=p["ppo.ent_coef"],
        vf_coef=p["ppo.vf_coef"],
        max_grad_norm=p["ppo.max_grad_norm"],
        policy_kwargs={"net_arch": list(p["policy.hidden_sizes"]), "activation_fn": torch.nn.Tanh},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t_learn = time.perf_counter()
    model.learn(total_timesteps=total_steps)
    learn = time.perf_counter() - t_learn
    end = time.perf_counter() - t_start
    score = evaluate(lambda obs: model.predict(obs, deterministic=True)[0])
    return {"learn_s": learn, "end_to_end_s": end, "greedy": score, "steps": int(model.num_timesteps)}


def rlfarm_run(seed: int, total_steps: int) -> dict:
    import numpy as np
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "-q",
                "train",
                "--preset",
                PRESET,
                "--workers",
                "2",
                "--seed",
                str(seed),
                "--total-steps",
                str(total_steps),
                "--logdir",
                tmp,
                "--run-id",
                "spread",
            ],
            check=True,
            cwd=ROOT,
            env={**os.environ, "RLFARM_HOME": tmp},
        )
        end = time.perf_counter() - t
        summary = json.loads((Path(tmp) / "spread" / "summary.json").read_text())
        from rlfarm import load

        policy = load(Path(tmp) / "spread" / "final_policy.safetensors")
        torch.set_num_threads(1)
        score = evaluate(lambda obs: np.asarray(policy.predict(obs, deterministic=True)[0]))
        return {"learn_s": summary["wall_seconds"], "end_to_end_s": end, "greedy": score, "steps": summary["env_steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--total-steps", type=int, default=0, help="agent steps (default: the preset's)")
    args = parser.parse_args()
    p = preset()
    total = args.total_steps or p["total_steps"]
    rows = []
    for seed in args.seeds:  # interleaved, so that a busy moment hits both alike
        rows.append(("rlfarm", seed, rlfarm_run(seed, total)))
        rows.append(("sb3", seed, sb3_run(seed, total, p)))
        print(f"seed {seed}: rlfarm {rows[-2][2]}, sb3 {rows[-1][2]}", flush=True)
    print(f"\nsimple_spread_v3, 3 agents, one shared policy, {total:,} agent steps; cores: {os.cpu_count()}")
    print(f"{'side':<8} {'seed':>4} {'greedy return':>14} {'learning s':>11} {'end to end s':>13}")
    for side, seed, r in rows:
        print(f"{side:<8} {seed:>4} {r['greedy']:>14.2f} {r['learn_s']:>11.1f} {r['end_to_end_s']:>13.1f}")
    mine = [r for side, _, r in rows if side == "rlfarm"]
    theirs = [r for side, _, r in rows if side == "sb3"]
    a, b = (statistics.mean(r["greedy"] for r in side) for side in (mine, theirs))
    print(f"mean greedy return  rlfarm {a:8.2f}   sb3 {b:8.2f}   rlfarm - sb3 {a - b:+6.2f} (higher is better)")
    for key, label in (("learn_s", "learning s"), ("end_to_end_s", "end to end s")):
        a, b = (statistics.mean(r[key] for r in side) for side in (mine, theirs))
        print(f"mean {label:<14} rlfarm {a:8.1f}   sb3 {b:8.1f}   sb3 / rlfarm {b / a:5.2f}")


if __name__ == "__main__":
    main()
