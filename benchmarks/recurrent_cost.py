"""What memory costs a task (issue 53): acting time and bytes of a recurrent policy beside the same
network without its core, on a worker's numpy actors, in one run on one machine.

    python benchmarks/recurrent_cost.py                       # the cartpole-no-vel-lstm preset's sizes
    python benchmarks/recurrent_cost.py --preset cartpole-no-vel-lstm --steps 512

For the preset's network (policy.hidden_sizes, recurrent_size) and one task's batch (env.num_envs
sub-envs, farm.steps_per_env steps): the time of a task's acting steps (the actor alone, no env) for
feed-forward (a dense layer of the core's width in the core's place), LSTM and GRU actors, their
ratio, and the bytes memory adds: to each result (the state each sequence started from,
Rollout.states) and to each env stream's snapshot (the state the next task goes on from). Times are
the best of --repeats.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def acting_seconds(actor, obs: np.ndarray, repeats: int) -> float:
    """Best of `repeats` passes of one task's acting steps: act on each step's batch."""
    rng = np.random.default_rng(0)
    best = float("inf")
    for _ in range(repeats):
        actor.begin(obs.shape[1])
        t = time.perf_counter()
        for step in obs:
            actor.act(step, rng)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cartpole-no-vel-lstm")
    parser.add_argument("--steps", type=int, help="steps of a task [the preset's farm.steps_per_env]")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    import torch

    from rlfarm import config as C
    from rlfarm.algos import network_for
    from rlfarm.envs import describe

    cfg = C.build(args.preset)
    spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    n, steps = cfg.env.num_envs, args.steps or cfg.farm.steps_per_env
    obs = np.random.default_rng(1).standard_normal((steps, n, spec.obs_dim)).astype(np.float32)
    torch.manual_seed(0)
    rows = []
    for kind in ("", "lstm", "gru"):
        policy = dataclasses.replace(cfg.policy, recurrent=kind)
        # Feed-forward: a dense layer of the core's width in its place, before each head's layers.
        if not kind:
            policy = dataclasses.replace(policy, hidden_sizes=(cfg.policy.recurrent_size, *cfg.policy.hidden_sizes))
        actor = network_for("ppo", spec, policy).actor_snapshot()
        seconds = acting_seconds(actor, obs, args.repeats)
        width = actor.state.shape[1] if kind else 0
        sequences = -(-steps // (cfg.policy.seq_len or steps))
        rows.append((kind or "feed-forward", seconds, width, sequences * n * width * 4, n * width * 4))
    base = rows[0][1]
    print(
        f"{args.preset}: {n} sub-envs x {steps} steps a task, hidden {list(cfg.policy.hidden_sizes)}, "
        f"core {cfg.policy.recurrent_size} units; acting only (no env), best of {args.repeats}"
    )
    header = f"{'actor':<13} {'ms a task':>9} {'us a step':>9} {'x ff':>5} {'state floats':>12}"
    print(f"{header} {'result +B':>9} {'snapshot +B':>11}")
    for name, seconds, width, result_bytes, snapshot_bytes in rows:
        print(
            f"{name:<13} {seconds * 1e3:>9.2f} {seconds / steps * 1e6:>9.1f} {seconds / base:>5.2f} "
            f"{width:>12} {result_bytes:>9,} {snapshot_bytes:>11,}"
        )


if __name__ == "__main__":
    main()
