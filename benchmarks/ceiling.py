"""The ceiling: tasks per second one trainer and one Redis turn over (dispatch -> worker -> result
consumed -> replacement dispatched) with trivial tasks, and what each part spends at that rate.

    python benchmarks/ceiling.py
    python benchmarks/ceiling.py --workers 4 8 16 32 --in-flight 2 --seconds 8

Tasks: CartPole-v1, 1 env x 1 step (the rollout itself is ~0.1 ms), so everything measured is the
farm. ASYNC as AsyncTrainer with an idle learner: `--in-flight` x W tasks in flight on W pool
processes (nodes of up to --per-node processes, `rlfarm worker`), each result replaced as soon as
it is received, all acting with a cached policy version. Tasks/s over --seconds after a warm-up;
CPU of each part in cores (CPU seconds per wall second), and per task. On a machine with fewer cores
than the parts need, they share the cores: "cores" says how much of the machine the farm took, and
1 / (trainer CPU per task) and 1 / (Redis CPU per task) are the rates a trainer or a Redis with a
core of its own would reach, if the workers were elsewhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import farmstats as fs  # noqa: E402

RUN = "ceiling"


def measure(farm: fs.Farm, in_flight: int, seconds: float) -> tuple[int, float, dict[str, float]]:
    """Tasks received in `seconds` with `in_flight` tasks always out, wall, and CPU seconds per part."""
    sent: dict[int, float] = {}
    for _ in range(in_flight):
        farm.submit(1, 0, sent)
    for _ in range(2 * in_flight):  # warm-up: every slot has turned over
        farm.next()
        farm.submit(1, 0, sent)
    before, start, tasks = farm.cpu(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        farm.next()
        farm.submit(1, 0, sent)
        tasks += 1
    wall = time.perf_counter() - start
    after = farm.cpu()
    for _ in range(in_flight):
        farm.next()
    return tasks, wall, {k: after[k] - before[k] for k in before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--in-flight", type=int, default=2, help="tasks in flight per pool process")
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--before", help="an older rlfarm checkout, measured first (PYTHONPATH)")
    args = parser.parse_args()
    if args.before:
        fs.run_before(args.before, __file__, sys.argv[1:])

    from rlfarm.local.cluster import LocalCluster

    print(fs.header("The ceiling (benchmarks/ceiling.py): CartPole-v1, 1 env x 1 step per task"))
    print(
        f"{'W':>3} {'nodes':>5} {'flight':>6} {'tasks/s':>8} | cores: {'trainer':>7} {'redis':>6} "
        f"{'celery':>6} {'pool':>6} {'sum':>5} | CPU ms/task: {'trainer':>7} {'redis':>6} {'celery':>6} "
        f"{'pool':>6} | 1/trainer 1/redis tasks/s | {'load 1/5/15':>14}"
    )
    with LocalCluster(workers=0, name="rlfarm-ceiling", extra_env=fs.worker_env()) as cluster:
        farm = fs.Farm(cluster, RUN, "CartPole-v1", args.per_node)
        for w in args.workers:
            farm.grow(w)
            tasks, wall, cpu = measure(farm, args.in_flight * w, args.seconds)
            cores = {k: v / wall for k, v in cpu.items()}
            per = {k: 1e3 * v / tasks for k, v in cpu.items()}
            print(
                f"{w:>3} {len(farm.nodes):>5} {args.in_flight * w:>6} {tasks / wall:>8.0f} |        "
                f"{cores['trainer']:>7.2f} {cores['redis']:>6.2f} {cores['celery']:>6.2f} "
                f"{cores['pool']:>6.2f} {sum(cores.values()):>5.2f} |              {per['trainer']:>7.3f} "
                f"{per['redis']:>6.3f} {per['celery']:>6.3f} {per['pool']:>6.3f} | "
                f"{1e3 / per['trainer']:>9.0f} {1e3 / per['redis']:>7.0f}       | {fs.loadavg():>14}",
                flush=True,
            )
    print(f"\nload average at the end: {fs.loadavg()}")


if __name__ == "__main__":
    main()
