"""What publishing a policy version costs Redis when every worker process acts with it: bytes Redis
sends per version and the time until every process acts with it, with 1, 4 and 16 pool processes on
one machine, each process fetching for itself (before: RLFARM_POLICY_SHARE=off), one fetch per
machine (after: rlfarm.farm.policies.machine, its default directory), and one fetch per machine of versions
published in float16 (farm.policy_dtype). Pong's policy (the Nature CNN, 6.75 MB), one run.

    python benchmarks/policy_fanout.py
    python benchmarks/policy_fanout.py --processes 1 4 16 --versions 6

Each process is a pool process's twin: a TaskHandler in a process of its own, acting with each
version in turn as a task does (fetch or read the machine's copy, check sha256, load into its
network, snapshot the actor). All processes of a trial start a version together (a barrier), as a
SYNC group's tasks do right after the trainer publishes it. Redis's own counter
(INFO stats total_net_output_bytes) gives the bytes; only these processes talk to this Redis.
Needs the atari extra (ale-py: Pong's spaces).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def act_with_each_version(url: str, run: str, incarnation: str, versions: int, share: str, barrier, queue):
    os.environ["RLFARM_POLICY_SHARE"] = share
    import torch

    torch.set_num_threads(1)  # as a pool process
    from rlfarm.worker.handler import TaskHandler

    worker = TaskHandler(url)
    worker._enter(run, incarnation)
    worker._run_meta(run)
    worker._network(run)  # built before the clock starts: a process builds it once per run
    times = []
    for v in range(versions):
        barrier.wait()
        started = time.perf_counter()
        worker._actor_of(run, v)
        times.append(time.perf_counter() - started)
    queue.put((times, worker.counts["policy_fetches"]))


def trial(url: str, run: str, n: int, versions: int, share: str, tag: str) -> dict:
    import redis

    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=act_with_each_version, args=(url, run, f"{tag}-{n}", versions, share, barrier, queue))
        for _ in range(n)
    ]
    client = redis.Redis.from_url(url)
    for p in procs:
        p.start()
    # Processes import torch and build the network before the first barrier; count bytes from then on
    # would need another barrier: the run's metadata they read first is a few KB, noise beside 6.75 MB.
    before = client.info("stats")["total_net_output_bytes"]
    results = [queue.get(timeout=600) for _ in procs]
    after = client.info("stats")["total_net_output_bytes"]
    for p in procs:
        p.join()
    per_version = list(zip(*[times for times, _ in results]))  # [version][process]
    return {
        "bytes_per_version": (after - before) / versions,
        "fetches": sum(f for _, f in results),
        "all_acting_ms": statistics.median(max(v) for v in per_version) * 1000,
        "one_process_ms": statistics.median(t for v in per_version for t in v) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--versions", type=int, default=6)
    args = parser.parse_args()

    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import describe
    from rlfarm.errors import EnvError
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.local.cluster import LocalCluster

    run = "fanout"
    cfg = C.build("pong", [f"run_id={run}"])
    from rlfarm.core import codec

    try:
        space = describe(cfg.env.id, C.to_dict(cfg)["env"])
    except EnvError as exc:
        sys.exit(f"policy_fanout.py needs Pong's spaces: {exc}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(workers=0, name="rlfarm-bench-fanout", log_dir=Path(tmp)) as cluster,
    ):
        network = ActorCritic(space, cfg.policy)
        sizes = {}
        for name, dtype in ((run, "float32"), (run + "16", "float16")):  # farm.policy_dtype
            store = PolicyStore(connect(cluster.redis_url), name, keep=args.versions + 1)
            store.set_run_meta({"config": C.to_dict(cfg), "space": space.to_dict()})
            for v in range(args.versions):
                with torch.no_grad():
                    for p in network.parameters():
                        p.add_(0.001)
                sizes[dtype] = len(store.publish(v, codec.wire_state(network.state_dict(), dtype), "ppo"))
        print(
            f"policy_fanout: Pong's network, {sizes['float32'] / 1e6:.2f} MB a version "
            f"({sizes['float16'] / 1e6:.2f} MB in float16), {args.versions} versions, {os.cpu_count()} "
            f"cores; processes act with each version together"
        )
        print(
            f"{'processes':>9}  {'mode':<22} {'Redis MB/version':>16} {'fetches':>8} "
            f"{'all acting (ms)':>16} {'one process (ms)':>17}"
        )
        rows = {}
        modes = (
            ("per process (before)", "off", run),
            ("per machine (after)", "", run),
            ("per machine, float16", "", run + "16"),
        )
        for n in args.processes:
            for mode, share, name in modes:  # "": the default directory (/dev/shm where it has room)
                r = trial(cluster.redis_url, name, n, args.versions, share, mode.split()[1].strip(","))
                rows[(n, mode)] = r
                print(
                    f"{n:>9}  {mode:<22} {r['bytes_per_version'] / 1e6:>16.2f} {r['fetches']:>8} "
                    f"{r['all_acting_ms']:>16.0f} {r['one_process_ms']:>17.0f}"
                )
        for n in args.processes:
            before = rows[(n, "per process (before)")]
            for mode in ("per machine (after)", "per machine, float16"):
                after = rows[(n, mode)]
                print(
                    f"{n:>2} processes, {mode}: Redis bytes per version / before = "
                    f"{after['bytes_per_version'] / before['bytes_per_version']:.3f}, time until all act "
                    f"/ before = {after['all_acting_ms'] / before['all_acting_ms']:.2f}"
                )


if __name__ == "__main__":
    main()
