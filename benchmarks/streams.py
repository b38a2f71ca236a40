"""What an env stream's snapshot costs per task (farm.episodes = "continue"), against the task itself.

    python benchmarks/streams.py
    python benchmarks/streams.py --repeats 9 --workloads pong halfcheetah

After every continue-mode task its worker saves the stream's complete state (rlfarm.envs.snapshot,
rlfarm.core.streams.encode: capture, msgpack, zstd, sha256) and pushes the blob with the result; a
process that does not hold the stream restores it first (decode: sha256, unzstd, msgpack; then
restore). Each workload is one task as its preset runs it, in this process, with an untrained PPO
actor acting as on a worker (ONNX Runtime for the Nature CNN where it is installed):

  pong         PongNoFrameskip-v4, 4 envs x 128 steps (the pong preset's task; AleVector)
  halfcheetah  HalfCheetah-v5, 1 env x 512 steps (halfcheetah-ppo's task)
  cartpole     CartPole-v1, 4 envs x 512 steps (a CartPole task)

Printed per workload (medians of --repeats tasks, wall clock): the task's collect time, the result's
bytes as the worker sends it (zstd arrays, farm.compress = auto), the snapshot's bytes, ms to save it
and ms to restore it, and both as a fraction of the task. Every figure comes from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

WORKLOADS = {
    "pong": (
        "PongNoFrameskip-v4",
        4,
        128,
        {"preprocess": "atari", "frame_stack": 4, "noop_max": 30, "clip_rewards": True},
    ),
    "halfcheetah": ("HalfCheetah-v5", 1, 512, {}),
    "cartpole": ("CartPole-v1", 4, 512, {}),
}


def measure(name: str, repeats: int) -> dict[str, float] | None:
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.core import codec, streams
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import collect
    from rlfarm.core.streams import EnvStream, stream_seeds
    from rlfarm.envs import describe, make_vector_env, snapshot
    from rlfarm.errors import EnvError

    env_id, n, steps, options = WORKLOADS[name]
    try:
        spec = describe(env_id, options)
        here = EnvStream(make_vector_env(env_id, n, options=options), stream_seeds(1, 0, 0, n))
        there = EnvStream(make_vector_env(env_id, n, options=options), stream_seeds(1, 0, 0, n))
    except EnvError as exc:  # an extra that is not installed
        print(f"{name}: skipped ({exc})")
        return None
    torch.set_num_threads(1)
    torch.manual_seed(0)
    actor = ActorCritic(spec, PolicyConfig()).actor_snapshot()
    collect_s, save_s, restore_s, blob_bytes, result_bytes = [], [], [], [], []
    for task in range(repeats + 1):  # the first task resets the envs and warms up: not counted
        t0 = time.perf_counter()
        rollout = collect(actor, here.envs, steps, [], task, stream=here)
        t1 = time.perf_counter()
        blob, digest = streams.encode(here, snapshot.capture(here.envs))
        t2 = time.perf_counter()
        streams.resume(there, streams.decode(blob, digest), snapshot.restore)
        t3 = time.perf_counter()
        message = Result("rollout", task, 0, rollout=rollout.to_dict()).to_message()
        if task:
            collect_s.append(t1 - t0)
            save_s.append(t2 - t1)
            restore_s.append(t3 - t2)
            blob_bytes.append(len(blob))
            result_bytes.append(len(codec.pack(message, compress="auto")))
    here.close()
    there.close()
    med = statistics.median
    return {
        "task_ms": 1e3 * med(collect_s),
        "result_kb": med(result_bytes) / 1e3,
        "snapshot_kb": med(blob_bytes) / 1e3,
        "save_ms": 1e3 * med(save_s),
        "restore_ms": 1e3 * med(restore_s),
        "env_steps": n * steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = {name: measure(name, args.repeats) for name in args.workloads}
    print(
        f"\n{'workload':<12} {'env steps':>9} {'task ms':>9} {'result KB':>10} {'snapshot KB':>12} "
        f"{'save ms':>8} {'restore ms':>11} {'save/task':>10} {'restore/task':>13} {'snap/result':>12}"
    )
    for name, r in rows.items():
        if r is None:
            continue
        print(
            f"{name:<12} {r['env_steps']:>9} {r['task_ms']:>9.1f} {r['result_kb']:>10.1f} {r['snapshot_kb']:>12.1f} "
            f"{r['save_ms']:>8.2f} {r['restore_ms']:>11.2f} {r['save_ms'] / r['task_ms']:>10.3f} "
            f"{r['restore_ms'] / r['task_ms']:>13.3f} {r['snapshot_kb'] / r['result_kb']:>12.3f}"
        )
    print("\nsave: every task; restore: only a task whose process does not hold its stream at the snapshot.")


if __name__ == "__main__":
    main()
