"""Many machines, simulated: how much of the ideal env steps/s W pool processes on several `rlfarm
worker` nodes reach, SYNC and ASYNC, on an env whose step costs wall time but almost no CPU.

    python benchmarks/scale.py                                   # 4 ms x 16 steps = 64 ms tasks
    python benchmarks/scale.py --steps 128                       # 4 ms x 128 steps = 512 ms tasks
    python benchmarks/scale.py --async-flight 1 2                # also ASYNC with 2W tasks in flight
    python benchmarks/scale.py --workers 1 2 4 8 16 32 64 --seconds 8
    python benchmarks/scale.py --before /tmp/rlfarm-before       # an older checkout first, then this one

The env is CartPole-v1 sleeping 4 ms before every step (benchmarks.slow_envs:cartpole_sleep_4ms;
`--env ...:cartpole_sleep_1ms` for 1 ms), one sub-env per task: a simulator on a machine of its own.
The ideal is W x the steps/s of one process running the same task in-process (`collect` with the
same actor, timed here, median of several; the sleep's nominal figure is printed beside it), so
efficiency = measured / ideal counts everything the farm adds, including the rollout itself running
slower on a machine shared by W processes.

Worker nodes (separate `rlfarm worker` processes, each standing for a machine) are added as W grows,
up to --per-node pool processes each: W = 1: one node of 1; 2: +1; 4: +2; 8: +4; 16: +8; 32: +8+8;
64: +4 x 8. For each W, after a warm-up in which every process makes its env and caches the policy:
  SYNC:  iterations of W tasks acting with a new version (published before each, as SyncTrainer
         does; --no-publish: always version 0), dispatched and gathered as TaskChannel.gather_group
         does; steps/s over the gathering time only (an update would come between iterations).
  ASYNC: W tasks in flight acting with "latest", each result replaced as soon as it is received
         (as AsyncTrainer does with an idle learner); a new version every W results. steps/s of the
         results received in a --seconds window. `--async-flight 1 2` adds ASYNC2x: 2W tasks in
         flight on W processes (async.tasks_in_flight = 2W), so a process that finishes finds its
         next task queued; its delivery then includes time spent queued.
Per task, from the result's timings and the two clocks (one machine): delivery (submit called ->
the worker's handle began), policy (cache lookup, or fetch of a new version), collect on the worker,
back (rollout done -> received by the trainer), turnaround (received -> its replacement submitted).
CPU of each part while measuring, in cores (CPU seconds per wall second): this trainer, Redis, the
nodes' main processes (Celery's consumers) and their pool processes; this machine has os.cpu_count().
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import farmstats as fs  # noqa: E402

RUN = "scale"  # the run id in the farm's Redis


@dataclass
class Phase:
    """One measured stretch: steps received over its wall time, per-task timelines, CPU per part."""

    steps: int = 0
    wall: float = 0.0
    lines: list[fs.Timeline] = field(default_factory=list)
    turnaround: list[float] = field(default_factory=list)
    iterations: list[dict[str, float]] = field(default_factory=list)  # SYNC only
    cores: dict[str, float] = field(default_factory=dict)
    load: str = ""


def sync_phase(farm: fs.Farm, workers: int, steps: int, seconds: float, publish: bool) -> Phase:
    phase = Phase()
    cpu0 = farm.cpu()
    while not phase.iterations or phase.wall < seconds:
        version = farm.publish() if publish else farm.version
        t0 = time.perf_counter()
        e0 = time.time()
        submitted: dict[int, float] = {}
        farm.submit_group(steps, version, workers, submitted)
        dispatched = time.time()
        got = []
        while len(got) < workers:
            got.append((farm.next(), time.time()))
        phase.wall += time.perf_counter() - t0
        lines = [fs.Timeline(submitted[r.iteration], received, r) for r, received in got]
        phase.lines += lines
        phase.steps += steps * workers
        phase.iterations.append(
            {
                "wall": got[-1][1] - e0,
                "dispatch": dispatched - e0,
                "last_start": max(x.started for x in lines) - e0,
                "slowest": max(x.result.duration for x in lines),
                "back_last": lines[-1].back,
            }
        )
    phase.cores = _cores(cpu0, farm.cpu(), phase.wall)
    return phase


def async_phase(farm: fs.Farm, workers: int, steps: int, seconds: float, publish: bool, flight: int = 1) -> Phase:
    """`flight` x W tasks in flight on W processes: beyond 1, a finished task's process finds the
    next one queued instead of waiting for the trainer's replacement (`async.tasks_in_flight`)."""
    phase = Phase()
    submitted = {}
    for _ in range(flight * workers):
        farm.submit(steps, "latest", submitted)
    received_count = 0
    warm = 2 * flight * workers  # results before the window opens: every slot has turned over
    start = cpu0 = None
    while start is None or time.perf_counter() - start < seconds:
        message = farm.next()
        received = time.time()
        farm.submit(steps, "latest", submitted)  # the replacement, at once
        turnaround = time.time() - received
        received_count += 1
        if received_count == warm:
            start, cpu0 = time.perf_counter(), farm.cpu()
        elif start is not None:
            phase.steps += steps
            phase.lines.append(fs.Timeline(submitted.pop(message.iteration), received, message))
            phase.turnaround.append(turnaround)
        if publish and received_count % workers == 0:  # after the replacement, as a learner's update
            farm.publish()
    phase.wall = time.perf_counter() - start
    phase.cores = _cores(cpu0, farm.cpu(), phase.wall)
    for _ in range(flight * workers):  # let the tasks in flight finish before the next phase
        farm.next()
    return phase


def _cores(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    return {k: (after[k] - before[k]) / wall for k in before}


def task_seconds(env_id: str, steps: int, network: Any, repeats: int = 7) -> tuple[float, float]:
    """One process running the task in-process, as a worker runs it: median wall and CPU seconds
    of `collect`."""
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.envs import make_vector_env

    actor = network.actor_snapshot()
    envs = make_vector_env(env_id, 1, trusted=False)
    times, cpu = [], []
    for i in range(repeats + 1):
        t, c = time.perf_counter(), time.process_time()
        collect(actor, envs, steps, *task_seeds(1, i, 0, 1))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(times[1:]), statistics.median(cpu[1:])


def row(w: int, nodes: int, mode: str, phase: Phase, task: float, steps: int) -> str:
    ideal = w * steps / task
    sps = phase.steps / phase.wall
    lines = phase.lines
    tasks = len(lines)
    if mode == "SYNC":  # per iteration: the slowest of W tasks, plus what comes before and after it
        per = fs.mean([it["wall"] for it in phase.iterations])
        extra = (
            f"dispatch {ms(fs.mean([it['dispatch'] for it in phase.iterations]))}  "
            f"last start {ms(fs.mean([it['last_start'] for it in phase.iterations]))}  "
            f"slowest {ms(fs.mean([it['slowest'] for it in phase.iterations]) - task)}  "
            f"back(last) {ms(fs.mean([it['back_last'] for it in phase.iterations]))}"
        )
    else:  # per task: the time a slot spends on it
        per = w * phase.wall / tasks
        extra = f"turnaround {ms(fs.mean(phase.turnaround))}"
    c = phase.cores
    # The farm's CPU per task, all parts: what W x 1/task tasks/s would need in cores.
    cpu_task = sum(c.values()) * phase.wall / tasks
    extra += f"  CPU/task {ms(cpu_task)}  cores at ideal {cpu_task * w / task:.2f}"
    return (
        f"{w:>3} {nodes:>5} {mode:<7} {sps:>8.0f} {ideal:>8.0f} {sps / ideal:>6.3f} {ms(per):>8} "
        f"{ms(per - task):>8} {ms(fs.mean([x.delivery for x in lines])):>8} "
        f"{ms(fs.mean([x.result.timings['checks'] for x in lines])):>7} "
        f"{ms(fs.mean([x.result.timings['policy'] for x in lines])):>7} "
        f"{ms(fs.mean([x.result.timings['collect'] for x in lines]) - task):>8} "
        f"{ms(fs.mean([x.back for x in lines])):>7} "
        f"{c['trainer']:>6.2f} {c['redis']:>6.2f} {c['celery']:>6.2f} {c['pool']:>6.2f} "
        f"{sum(c.values()):>6.2f} {phase.load:>14}  {extra}"
    )


def ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--env", default="benchmarks.slow_envs:cartpole_sleep_4ms")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the env's sleep per step (nominal ideal)")
    parser.add_argument("--steps", type=int, default=16, help="env steps per task (1 sub-env)")
    parser.add_argument("--per-node", type=int, default=8, help="pool processes per node at most")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per W and mode")
    parser.add_argument(
        "--no-publish",
        dest="publish",
        action="store_false",
        help="no new versions while measuring (every task acts with a cached policy)",
    )
    parser.add_argument(
        "--async-flight",
        type=int,
        nargs="+",
        default=[1],
        help="ASYNC rows with K x W tasks in flight on W processes (row ASYNC{K}x)",
    )
    parser.add_argument("--before", help="an older rlfarm checkout, measured first (PYTHONPATH)")
    args = parser.parse_args()
    if args.before:
        fs.run_before(args.before, __file__, sys.argv[1:])

    from rlfarm.local.cluster import LocalCluster

    print(fs.header("Many machines, simulated (benchmarks/scale.py)"))
    os.environ.update(fs.worker_env())  # this process builds the env too (task_seconds)
    with LocalCluster(workers=0, name="rlfarm-scale", extra_env=fs.worker_env()) as cluster:
        farm = fs.Farm(cluster, RUN, args.env, args.per_node)
        task, task_cpu = task_seconds(args.env, args.steps, farm.network)
        print(
            f"task: {args.env}, 1 env x {args.steps} steps; in-process {ms(task)} ms, CPU {ms(task_cpu)} ms "
            f"(nominal {args.steps * args.step_ms:.0f} ms of sleep): one process {args.steps / task:.0f} "
            f"steps/s; new version {'every SYNC iteration / every W ASYNC results' if args.publish else 'never'}"
        )
        print(
            f"{'W':>3} {'nodes':>5} {'mode':<7} {'steps/s':>8} {'ideal':>8} {'eff':>6} {'per':>8} "
            f"{'over':>8} {'deliv':>8} {'checks':>7} {'policy':>7} {'coll+':>8} {'back':>7} "
            f"{'trainr':>6} {'redis':>6} {'celery':>6} {'pool':>6} {'cores':>6} {'load 1/5/15':>14}"
        )
        memory = []
        for w in args.workers:
            farm.grow(w)
            for _ in range(3):  # warm-up: every process makes its env and caches a policy
                sync_phase(farm, w, args.steps, 0.0, False)
            modes = [("SYNC", sync_phase)] + [
                ("ASYNC" if k == 1 else f"ASYNC{k}x", lambda *a, k=k: async_phase(*a, flight=k))
                for k in args.async_flight
            ]
            for mode, measure in modes:
                phase = measure(farm, w, args.steps, args.seconds, args.publish)
                phase.load = fs.loadavg()
                print(row(w, len(farm.nodes), mode, phase, task, args.steps), flush=True)
            pss, procs = fs.pss_mib([p.pid for p in cluster.worker_procs])
            memory.append((w, len(farm.nodes), procs, pss))
    print(
        "\nper: SYNC ms per iteration, ASYNC ms of slot time per task (W x wall / tasks); over: per - "
        "in-process task; deliv: submit called -> handle began; checks, policy: the worker's timings; "
        "coll+: collect on the worker - in-process; back: rollout done -> received; cores: CPU "
        "seconds per wall second of trainer, Redis, nodes' main processes (Celery), pool processes, "
        "and their sum; CPU/task: all of it per task; cores at ideal: what the ideal rate would need"
    )
    print("\nmemory of the worker nodes (PSS: shared pages split between the processes sharing them)")
    print(f"{'W':>3} {'nodes':>5} {'processes':>9} {'PSS MiB':>8} {'MiB per pool process':>21}")
    for w, nodes, procs, pss in memory:
        print(f"{w:>3} {nodes:>5} {procs:>9} {pss:>8.0f} {pss / w:>21.1f}")
    print(f"\nload average at the end: {fs.loadavg()}")


if __name__ == "__main__":
    main()
