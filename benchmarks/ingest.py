"""The trainer's ingest ceiling: how many env steps a second one trainer process takes in, for results
of real sizes, with a learner that does nothing. Receiving (BLPOP from a real redis-server), the
signature check, decoding (msgpack, zstd) and stacking a batch are the trainer's own calls
(rlfarm.trainer.channel.TaskChannel.receive, Rollout.from_dict, rollout.concat); only the learner is
left out. So 1 / (trainer CPU per result) is how many results a second one trainer core can take,
and divided by a worker's rate, how many workers it can feed.

    python benchmarks/ingest.py                              # cartpole, halfcheetah, pong; 8 s each
    python benchmarks/ingest.py --workloads pong --seconds 20 --producers 3

Per workload, one result is made as a worker makes it: its preset's env, vectorised as on a worker,
stepped by the preset's untrained network for one task (Pong: ALE frames, 84x84, four stacked, uint8,
compressed as `farm.compress` says), encoded (rlfarm.worker.results.encode_result) and sealed with a
secret. `--producers` processes push copies of it into Redis as fast as the trainer takes them
(each keeps the list at most --backlog long, so Redis holds a bounded queue, as the farm's
back-pressure does). The consumer takes `--batch` results, decodes them and concatenates their
rollouts into one batch, like the ASYNC trainer before an update, then drops it.

Workloads whose env is not installed (the atari and mujoco extras) are skipped with the reason.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUN = "ingest"
SECRET = b"ingest-benchmark-secret-0123456789"
WORKLOADS = {  # name: (preset, a worker's env steps per second, for "workers fed")
    "cartpole": ("cartpole-ppo", 20_000),
    "halfcheetah": ("halfcheetah-ppo", 5_000),
    "pong": ("pong", 500),  # a Pong worker process acts ~500 env steps/s (benchmarks/pong.py)
}


def make_result(preset: str) -> tuple[bytes, int, dict]:
    """One sealed result of `preset`'s task size; (bytes, env steps in it, what it holds)."""
    from rlfarm import algos
    from rlfarm.api import make_config
    from rlfarm.config import to_dict
    from rlfarm.core import signing
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.envs import describe, make_vector_env
    from rlfarm.worker.results import encode_result

    cfg = make_config(preset)
    env_options = to_dict(cfg)["env"]
    spec = describe(cfg.env.id, env_options)
    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, options=env_options)
    actor = algos.network_for(cfg.algo, spec, cfg.policy).actor_snapshot()
    env_seeds, action_seed = task_seeds(cfg.seed, 0, 0, cfg.env.num_envs)
    keep_next_obs = algos.learner(cfg.algo, cfg.mode).collect_next_obs
    rollout = collect(actor, envs, cfg.farm.steps_per_env, env_seeds, action_seed, keep_next_obs=keep_next_obs)
    envs.close()
    result = Result("rollout", 0, 0, version=0, worker="ingest@bench", rollout=rollout.to_dict())
    payload = encode_result(result, to_dict(cfg)["farm"])
    steps = int(rollout.rewards.size)
    raw = sum(v.nbytes for v in rollout.to_dict().values() if hasattr(v, "nbytes"))
    return signing.seal_result(RUN, payload, SECRET), steps, {"raw_bytes": raw, "compress": cfg.farm.compress}


def produce(url: str, blob: bytes, backlog: int, stop: mp.Event) -> None:
    """Push copies of `blob` while the list is shorter than `backlog`."""
    import redis

    from rlfarm.farm import keys

    client = redis.Redis.from_url(url)
    key = keys.results(RUN)
    while not stop.is_set():
        room = backlog - client.llen(key)
        if room <= 0:
            time.sleep(0.0005)
            continue
        pipe = client.pipeline(transaction=False)
        for _ in range(min(room, 8)):
            pipe.rpush(key, blob)
        pipe.execute()


def consume(url: str, seconds: float, batch: int, steps_per_result: int) -> dict:
    """The trainer's receive path for `seconds` (after a 1 s warm-up): results, env steps and CPU."""
    import redis

    from rlfarm.core import codec, signing
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import Rollout, concat
    from rlfarm.farm import keys

    client = redis.Redis.from_url(url)
    key = keys.results(RUN)

    def one() -> Rollout:
        item = None
        while item is None:
            item = client.blpop([key], timeout=1.0)
        message = codec.unpack(signing.open_result(RUN, item[1], SECRET))
        return Rollout.from_dict(Result.from_message(message).rollout)

    warm = time.monotonic() + 1.0
    while time.monotonic() < warm:
        concat([one() for _ in range(batch)])
    results, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        concat([one() for _ in range(batch)])
        results += batch
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "results_per_s": results / wall,
        "env_steps_per_s": results * steps_per_result / wall,
        "trainer_cpu_ms_per_result": 1000 * cpu / results,
        "trainer_cores": cpu / wall,
        "ceiling_env_steps_per_core_s": steps_per_result / (cpu / results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=32, help="results waiting in Redis at most")
    parser.add_argument("--batch", type=int, default=8, help="results stacked per batch (results_per_update)")
    args = parser.parse_args()

    from rlfarm.envs import EnvError
    from rlfarm.local.cluster import LocalCluster

    rows = []
    with LocalCluster(workers=0, name="rlfarm-ingest-bench") as cluster:
        import redis

        from rlfarm.farm import keys

        for name in args.workloads:
            preset, worker_rate = WORKLOADS[name]
            try:
                blob, steps, held = make_result(preset)
            except (EnvError, ImportError) as exc:
                print(f"{name}: skipped: {' '.join(str(exc).split())[:200]}")
                continue
            redis.Redis.from_url(cluster.redis_url).delete(keys.results(RUN))
            stop = mp.Event()
            producers = [
                mp.Process(target=produce, args=(cluster.redis_url, blob, args.backlog, stop), daemon=True)
                for _ in range(args.producers)
            ]
            for p in producers:
                p.start()
            try:
                measured = consume(cluster.redis_url, args.seconds, args.batch, steps)
            finally:
                stop.set()
                for p in producers:
                    p.join(timeout=10)
            rows.append((name, preset, steps, len(blob), held, measured, worker_rate))

    print()
    print(f"trainer ingest, one process, {args.producers} producer processes, batches of {args.batch} results")
    head = "workload     env steps  bytes/result  raw bytes  results/s  env steps/s  CPU ms/result"
    print(head + "  ceiling/core  workers fed")
    for name, _preset, steps, size, held, m, rate in rows:
        ceiling = m["ceiling_env_steps_per_core_s"]
        print(
            f"{name:<12} {steps:>9,}  {size:>12,}  {held['raw_bytes']:>9,}  {m['results_per_s']:>9.1f}  "
            f"{m['env_steps_per_s']:>11,.0f}  {m['trainer_cpu_ms_per_result']:>13.2f}  {ceiling:>12,.0f}  "
            f"{ceiling / rate:>5.0f} at {rate:,}/s"
        )
    print(
        "ceiling/core: env steps/s one trainer core could take in (steps per result / CPU per result); "
        "workers fed: that ceiling over a worker's rate. The measured rate shares this machine's cores "
        "with the producers and Redis."
    )


if __name__ == "__main__":
    main()
