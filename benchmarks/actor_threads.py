"""A worker's numpy actor with numpy's BLAS on its default thread pool against one thread
(rlfarm.worker.hooks limits every pool process to one), while the other cores are busy, as a farm's
other worker processes keep them.

    python benchmarks/actor_threads.py
    python benchmarks/actor_threads.py --hidden 64 64 --batch 8

The actor: PPO's MLP actor-critic (numpy copy, rlfarm.algos.ppo.policies.NumpyActor) on connect
four's 84 inputs and 7 actions, acting on a batch of `--batch` observations, as a task's collect does
at every step. One process, one run: the ratio is what the limit buys on this machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits


def _burn(stop: mp.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def _time(actor, obs: np.ndarray, rng: np.random.Generator, seconds: float) -> float:
    actor.act(obs, rng)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actor.act(obs, rng)
        calls += 1
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import RunConfig
    from rlfarm.envs import SpaceSpec

    spec = SpaceSpec(84, True, 7)
    policy = dataclasses.replace(RunConfig().policy, hidden_sizes=tuple(args.hidden), activation="relu")
    actor = ActorCritic(spec, policy).actor_snapshot()
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 2, (args.batch, 84)).astype(np.float32)
    pools = [(p["internal_api"], p["num_threads"]) for p in threadpool_info()]
    stop = mp.Event()
    busy = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(max(1, (os.cpu_count() or 2) - 1))]
    for p in busy:
        p.start()
    try:
        default = _time(actor, obs, rng, args.seconds)
        with threadpool_limits(limits=1):
            one = _time(actor, obs, rng, args.seconds)
    finally:
        stop.set()
        for p in busy:
            p.join()
    print(f"numpy actor {args.hidden}, batch {args.batch}, {len(busy)} other core(s) busy; BLAS pools {pools}")
    print(f"  default threads: {default * 1e3:.3f} ms a step")
    print(f"  one thread:      {one * 1e3:.3f} ms a step")
    print(f"  one thread is {default / one:.1f}x faster")


if __name__ == "__main__":
    main()
