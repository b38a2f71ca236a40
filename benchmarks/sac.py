"""SAC on the farm against Stable-Baselines3 SAC, in one run.

    pip install -e ".[bench,mujoco]"
    python benchmarks/sac.py --seeds 1 2 3 4 5                      # Pendulum-v1: time and steps to -250
    python benchmarks/sac.py --seeds 1 --cheetah-steps 30000        # and HalfCheetah-v5 on a fixed budget

Pendulum-v1: "solved" when a greedy evaluation (10 episodes, every 1,000 env steps) reaches -250 and
20 more episodes with other seeds agree: the pendulum-sac preset's stop rule, applied to SB3 too
(its clock paused while it evaluates; rlfarm evaluates on the workers, off the training path). Both
sides use rl-baselines3-zoo's Pendulum-v1 hyper-parameters (learning rate 1e-3, SB3's SAC defaults
otherwise). rlfarm runs the pendulum-sac preset on the embedded default with 2 worker processes.

HalfCheetah-v5: the same env-step budget for both (`--cheetah-steps`, learning starting at
`--cheetah-learning-starts`), zoo's settings otherwise (preset halfcheetah-sac); the policy each side
ends with is scored on 5 greedy episodes; wall-clock side by side. Times are from the start of
learning; end-to-end times include rlfarm's cluster start-up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_sb3 import CONFIRM, ROOT, greedy_eval_callback, greedy_returns  # noqa: E402

TARGET = -250.0
EVAL_EVERY = 1_000


def sb3_pendulum(seed: int, max_steps: int = 20_000) -> tuple[float, int]:
    """(seconds of learning to a confirmed greedy -250 or nan, env steps) of SB3 SAC, zoo settings."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    eval_env = gym.make("Pendulum-v1")
    callback = greedy_eval_callback(eval_env, EVAL_EVERY, TARGET)
    model.learn(total_timesteps=max_steps, callback=callback)
    return callback.solved_at if callback.solved_at else (float("nan"), -1)


def rlfarm_train(
    preset: str, seed: int, workers: int, *extra: str
) -> tuple[dict, Path, float, tempfile.TemporaryDirectory]:
    tmp = tempfile.TemporaryDirectory()
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "train",
            "--preset",
            preset,
            "--seed",
            str(seed),
            "--workers",
            str(workers),
            "--logdir",
            tmp.name,
            "--run-id",
            "bench",
            *extra,
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    run_dir = Path(tmp.name) / "bench"
    return json.loads((run_dir / "summary.json").read_text()), run_dir, time.perf_counter() - t, tmp


def rlfarm_pendulum(seed: int, workers: int) -> tuple[float, int, float]:
    summary, _, end_to_end, tmp = rlfarm_train("pendulum-sac", seed, workers)
    tmp.cleanup()
    at = summary["target_reached_at"]
    return (at["wall_seconds"], int(at["env_steps"]), end_to_end) if at else (float("nan"), -1, end_to_end)


def rlfarm_eval(policy: Path, env_id: str, episodes: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "eval",
            "--policy",
            str(policy),
            "--env",
            env_id,
            "--episodes",
            str(episodes),
            "--seed",
            "50000",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return float(out.split("mean return")[1].split()[0])


def cheetah(seed: int, steps: int, learning_starts: int, workers: int) -> tuple[float, float, float, float]:
    """(rlfarm seconds, rlfarm greedy return, SB3 seconds, SB3 greedy return) on the same budget."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC

    summary, run_dir, _, tmp = rlfarm_train(
        "halfcheetah-sac",
        seed,
        workers,
        "--total-steps",
        str(steps),
        "--set",
        f"sac.learning_starts={learning_starts}",
        "--set",
        "eval.interval=0",
    )
    farm_return = rlfarm_eval(run_dir / "final_policy.safetensors", "HalfCheetah-v5", 5)
    tmp.cleanup()
    torch.set_num_threads(1)
    model = SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=learning_starts, seed=seed, device="cpu", verbose=0)
    t = time.perf_counter()
    model.learn(total_timesteps=steps)
    sb3_seconds = time.perf_counter() - t
    sb3_return = statistics.mean(greedy_returns(model, gym.make("HalfCheetah-v5"), 5, 50_000))
    return summary["wall_seconds"], farm_return, sb3_seconds, sb3_return


def median(xs: list[float]) -> float:
    return statistics.median(math.inf if math.isnan(x) else x for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cheetah-steps", type=int, default=0, help="HalfCheetah-v5 budget (0: skip it)")
    parser.add_argument("--cheetah-learning-starts", type=int, default=5_000)
    parser.add_argument("--cheetah-seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; Pendulum-v1 solved: greedy evaluation >= {TARGET:g}, confirmed on {CONFIRM} more")
    print(f"{'seed':>4} {'rlfarm s':>9} {'steps':>7} {'SB3 s':>7} {'steps':>7} {'rlfarm/SB3':>10}")
    rows = []
    for seed in args.seeds:
        r, b = rlfarm_pendulum(seed, args.workers), sb3_pendulum(seed)
        rows.append((r, b))
        print(f"{seed:>4} {r[0]:>9.1f} {r[1]:>7} {b[0]:>7.1f} {b[1]:>7} {r[0] / b[0]:>10.2f}", flush=True)
    mr, mb = median([r[0][0] for r in rows]), median([r[1][0] for r in rows])
    solved = [sum(not math.isnan(r[i][0]) for r in rows) for i in range(2)]
    print(
        f"median time to solve: rlfarm {mr:.1f} s, SB3 {mb:.1f} s -> {mr / mb:.2f}x; solved: rlfarm "
        f"{solved[0]}, SB3 {solved[1]} of {len(rows)}; median env steps: rlfarm "
        f"{statistics.median(r[0][1] for r in rows):.0f}, SB3 {statistics.median(r[1][1] for r in rows):.0f}"
    )
    if args.cheetah_steps:
        print(
            f"\nHalfCheetah-v5, {args.cheetah_steps} env steps each, learning from step {args.cheetah_learning_starts}"
        )
        print(f"{'seed':>4} {'rlfarm s':>9} {'return':>8} {'SB3 s':>7} {'return':>8} {'rlfarm/SB3 time':>15}")
        for seed in args.cheetah_seeds:
            fs, fr, bs, br = cheetah(seed, args.cheetah_steps, args.cheetah_learning_starts, args.workers)
            print(f"{seed:>4} {fs:>9.1f} {fr:>8.1f} {bs:>7.1f} {br:>8.1f} {fs / bs:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
