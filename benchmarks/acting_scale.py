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

`--reference` also scales a loop of pure Python arithmetic that shares nothing but the cores (no
memory traffic beyond its cache, no I/O): its efficiency is the machine's own (a VM's cores shared
with neighbours, clocks that drop as more cores run), and acting's efficiency over it is what is left
for rlfarm's acting to answer for.
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


def spin(preset: str, start_at: float, seconds: float, index: int) -> float:
    """One process: rounds/s of a pure Python loop over [start_at, start_at + seconds)."""

    def one_round() -> int:
        total = 0
        for i in range(20_000):
            total += i * i
        return total

    while time.time() < start_at:
        one_round()
    done, end = 0, start_at + seconds
    while time.time() < end:
        one_round()
        done += 1
    return done / (time.time() - start_at)


def measure(preset: str, processes: int, seconds: float, warmup: float, job=act) -> float:
    """Env steps/s of `processes` processes acting at once (the sum of theirs); rounds/s with `spin`."""
    start_at = time.time() + warmup
    context = multiprocessing.get_context("spawn")  # fresh interpreters, as worker pools are started
    with context.Pool(processes) as pool:
        rates = pool.starmap(job, [(preset, start_at, seconds, i) for i in range(processes)])
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="pong")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 14])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per N")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds from start to the window (imports, envs)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of one process alone (median)")
    parser.add_argument(
        "--reference", action="store_true", help="also scale a pure Python loop: the machine's own efficiency"
    )
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    alone = statistics.median(measure(args.preset, 1, args.seconds, args.warmup) for _ in range(args.repeat))
    spin_seconds = min(args.seconds, 4.0)
    # One process's loop alone varied by a fifth from one window to the next on these VMs: a median of 3.
    spun = (
        statistics.median(measure(args.preset, 1, spin_seconds, 1.0, spin) for _ in range(3)) if args.reference else 0.0
    )
    print(f"cores: {cores}; preset {args.preset}; {args.seconds:.0f} s windows")
    extra = f" {'machine':>8} {'acting/machine':>15}" if args.reference else ""
    print(f"{'processes':>9} {'env steps/s':>12} {'per process':>12} {'efficiency':>11}{extra}")
    print(f"{1:>9} {alone:>12.0f} {alone:>12.0f} {1.0:>11.2f}" + (f" {1.0:>8.2f} {1.0:>15.2f}" if spun else ""))
    for n in args.processes:
        if n == 1:
            continue
        if n > cores:
            print(f"{n:>9} (skipped: {cores} cores)")
            continue
        rate = measure(args.preset, n, args.seconds, args.warmup)
        efficiency = rate / (n * alone)
        line = f"{n:>9} {rate:>12.0f} {rate / n:>12.0f} {efficiency:>11.2f}"
        if spun:
            machine = measure(args.preset, n, spin_seconds, 1.0, spin) / (n * spun)
            line += f" {machine:>8.2f} {efficiency / machine:>15.2f}"
        print(line, flush=True)
    print("efficiency: env steps/s of N processes / (N x one process alone)")
    if spun:
        print(
            "machine: the same for a pure Python loop on N processes (nothing shared but the cores); "
            "acting/machine: acting's efficiency over the machine's own"
        )


if __name__ == "__main__":
    main()
