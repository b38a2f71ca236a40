"""Acting on N processes of one machine: the env steps/s N worker-like processes deliver on a preset's
envs with its actor (Pong: ALE's emulators and the Nature CNN through ONNX Runtime, one thread each),
against N x one process alone. Efficiency = measured / (N x alone): what a machine's cores give a
farm before any Redis, Celery or trainer (benchmarks/scale.py measures those on top).

    python benchmarks/acting_scale.py                            # pong, 1 2 4 8 14 processes
    python benchmarks/acting_scale.py --processes 1 2 --seconds 5
    python benchmarks/acting_scale.py --preset cartpole-ppo

Each process builds the preset's vector env and a fresh network's actor, as a worker's pool process
does, acts tasks of `farm.steps_per_env` steps (rlfarm.core.rollout.collect) for a warm-up, then
counts the env steps of the tasks it finishes in a window that opens at the same moment for all N.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def act(preset: str, start_at: float, seconds: float, index: int) -> float:
    """One process: env steps/s over [start_at, start_at + seconds) of tasks acted back to back."""
    import torch
    from threadpoolctl import threadpool_limits

    from rlfarm import config as C
    from rlfarm.algos import learner, network_for
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.envs import describe, make_vector_env

    torch.set_num_threads(1)  # as a worker's pool process
    threadpool_limits(limits=1)
    cfg = C.build(preset, [])
    options = C.to_dict(cfg)["env"]
    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, options=options)
    spec = describe(cfg.env.id, options)
    actor = learner(cfg.algo).actor_snapshot(network_for(cfg.algo, spec, cfg.policy))
    steps = cfg.farm.steps_per_env
    task = 0

    def one_task() -> int:
        nonlocal task
        env_seeds, action_seed = task_seeds(cfg.seed, task, index, cfg.env.num_envs)
        task += 1
        return collect(actor, envs, steps, env_seeds, action_seed).num_steps

    while time.time() < start_at:  # warm up (envs made, ONNX graph exported) until the window opens
        one_task()
    done, end = 0, start_at + seconds
    while time.time() < end:
        done += one_task()
    return done / (time.time() - start_at)


def measure(preset: str, processes: int, seconds: float, warmup: float) -> float:
    """Env steps/s of `processes` processes acting at once (the sum of theirs)."""
    start_at = time.time() + warmup
    context = multiprocessing.get_context("spawn")  # fresh interpreters, as worker pools are started
    with context.Pool(processes) as pool:
        rates = pool.starmap(act, [(preset, start_at, seconds, i) for i in range(processes)])
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="pong")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 14])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per N")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds from start to the window (imports, envs)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of one process alone (median)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    alone = statistics.median(measure(args.preset, 1, args.seconds, args.warmup) for _ in range(args.repeat))
    print(f"cores: {cores}; preset {args.preset}; {args.seconds:.0f} s windows")
    print(f"{'processes':>9} {'env steps/s':>12} {'per process':>12} {'efficiency':>11}")
    print(f"{1:>9} {alone:>12.0f} {alone:>12.0f} {1.0:>11.2f}", flush=True)
    for n in args.processes:
        if n == 1:
            continue
        if n > cores:
            print(f"{n:>9} (skipped: {cores} cores)")
            continue
        rate = measure(args.preset, n, args.seconds, args.warmup)
        print(f"{n:>9} {rate:>12.0f} {rate / n:>12.0f} {rate / (n * alone):>11.2f}", flush=True)
    print("efficiency: env steps/s of N processes / (N x one process alone)")


if __name__ == "__main__":
    main()
