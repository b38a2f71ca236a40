"""Env steps per second: raw env, in-process collect, multiprocessing.Pool(W), and the farm with W workers.

    python benchmarks/throughput.py --workers 2 --task-steps 8192
    python benchmarks/throughput.py --workers 1 2 4 8 14        # on a machine with 16 cores
    python benchmarks/throughput.py --env ALE/Pong-v5 --workers 1 2 --task-steps 1024 --tasks-per-worker 4
        # Atari (pip install -e ".[atari]"): DeepMind preprocessing, the Nature CNN acting on CPU

Every figure comes from this one run, so the printed ratios compare like with like:
  (a) raw:     gymnasium vector env, random actions, no policy
  (b) collect: rlfarm.core.rollout.collect in this process (policy acting, the work of one task)
  (c) pool:    multiprocessing.Pool(W) (spawn) running the same collect on the same task specs
  (d) farm:    LocalCluster (real redis-server + Celery, W pool processes) running the same tasks,
               results gathered by the trainer's TaskChannel; also its CPU time spent receiving
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _setup(env_id: str, num_envs: int, state: dict | None):
    import torch

    torch.set_num_threads(1)
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.envs import describe, make_vector_env

    torch.manual_seed(0)
    policy = ActorCritic(describe(env_id), PolicyConfig())
    if state is not None:
        policy.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return policy, make_vector_env(env_id, num_envs)


_POOL: dict = {}


def _pool_init(env_id: str, num_envs: int, state: dict) -> None:
    _POOL["policy"], _POOL["envs"] = _setup(env_id, num_envs, state)
    _POOL["actor"] = _POOL["policy"].actor_snapshot()


def _pool_task(args: tuple[int, int, int]) -> int:
    from rlfarm.core.rollout import collect, task_seeds

    index, steps, seed = args
    envs = _POOL["envs"]
    env_seeds, action_seed = task_seeds(seed, 0, index, envs.num_envs)
    r = collect(_POOL["actor"], envs, steps, env_seeds, action_seed)
    # Return the arrays as the farm does, so both pay for moving the result back.
    return len(r.to_dict()["obs"])


def bench_raw(env_id: str, num_envs: int, total: int) -> float:
    from rlfarm.envs import make_vector_env

    envs = make_vector_env(env_id, num_envs)
    envs.reset(seed=list(range(num_envs)))
    envs.action_space.seed(0)
    t = time.perf_counter()
    for _ in range(total // num_envs):
        envs.step(envs.action_space.sample())
    return total / (time.perf_counter() - t)


def bench_collect(env_id: str, num_envs: int, steps: int, repeats: int) -> float:
    from rlfarm.core.rollout import collect, task_seeds

    policy, envs = _setup(env_id, num_envs, None)
    actor = policy.actor_snapshot()
    collect(actor, envs, 64, *task_seeds(0, 0, 0, num_envs))  # warm-up
    t = time.perf_counter()
    for i in range(repeats):
        collect(actor, envs, steps, *task_seeds(0, 0, i, num_envs))
    return repeats * num_envs * steps / (time.perf_counter() - t)


def bench_pool(env_id: str, workers: int, num_envs: int, steps: int, tasks: int) -> float:
    policy, _ = _setup(env_id, 1, None)
    state = {k: v.numpy() for k, v in policy.state_dict().items()}
    ctx = mp.get_context("spawn")  # fork after torch initialised serialises the children
    with ctx.Pool(workers, initializer=_pool_init, initargs=(env_id, num_envs, state)) as pool:
        pool.map(_pool_task, [(i, 64, 0) for i in range(workers)])  # warm-up: imports, env creation
        t = time.perf_counter()
        pool.map(_pool_task, [(i, steps, 0) for i in range(tasks)], chunksize=1)
        return tasks * num_envs * steps / (time.perf_counter() - t)


def bench_farm(env_id: str, workers: int, num_envs: int, steps: int, tasks: int) -> tuple[float, float, float]:
    """Steps/s, and trainer CPU seconds per wall second while gathering (all of it is receiving)."""
    from rlfarm import config as C
    from rlfarm.envs import describe
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.local.cluster import LocalCluster
    from rlfarm.trainer.channel import FarmLink

    policy, _ = _setup(env_id, 1, None)
    cfg = C.build(None, [f"env.num_envs={num_envs}", "run_id=bench", f"env.id={env_id}"])
    with LocalCluster(workers=workers, name="rlfarm-bench") as cluster:
        client = connect(cluster.redis_url)
        store = PolicyStore(client, "bench")
        store.set_run_meta({"config": C.to_dict(cfg), "space": describe(env_id).to_dict()})
        store.publish(0, policy.state_dict(), "ppo")
        d = FarmLink(make_app(cluster.redis_url), client, "bench", 600, 1).open()
        spec = lambda it, i, n: {"iteration": it, "index": i, "version": 0, "steps": n, "seed": 0}
        d.gather_group([spec(0, i, 64) for i in range(2 * workers)])  # warm-up: envs, policy cache
        cpu0, t = time.process_time(), time.perf_counter()
        d.gather_group([spec(1, i, steps) for i in range(tasks)])
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu0
        return tasks * num_envs * steps / wall, cpu / wall, d.stats.receive_seconds / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium id (ALE ids get Atari preprocessing)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--task-steps", type=int, default=8192, help="env steps per task")
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs per task")
    parser.add_argument("--tasks-per-worker", type=int, default=8)
    args = parser.parse_args()
    steps = args.task_steps // args.num_envs

    raw = bench_raw(args.env, args.num_envs, 100_000 if args.env == "CartPole-v1" else 8_000)
    inproc = bench_collect(args.env, args.num_envs, steps, repeats=6)
    print(
        f"cores: {os.cpu_count()}  env: {args.env}  task: {args.num_envs} envs x {steps} steps = "
        f"{args.num_envs * steps} env steps"
    )
    print(f"(a) raw vector env, random actions: {raw:10.0f} steps/s")
    print(f"(b) in-process collect():           {inproc:10.0f} steps/s")
    print(
        f"{'W':>3} {'(c) Pool(W)':>12} {'(d) farm':>10} {'(d)/(c)':>8} {'(d)/(W*b)':>10} "
        f"{'trainer CPU':>12} {'decode CPU':>11}"
    )
    for w in args.workers:
        tasks = args.tasks_per_worker * w
        pool = bench_pool(args.env, w, args.num_envs, steps, tasks)
        farm, cpu, decode = bench_farm(args.env, w, args.num_envs, steps, tasks)
        print(
            f"{w:>3} {pool:>12.0f} {farm:>10.0f} {farm / pool:>8.2f} {farm / (w * inproc):>10.2f} "
            f"{cpu:>11.1%} {decode:>11.1%}",
            flush=True,
        )
    print("trainer CPU: the trainer process's CPU time / wall time while gathering (receiving only)")


if __name__ == "__main__":
    main()
