"""Start-up and shut-down cost of a small run, end to end, against another checkout of rlfarm.

    python benchmarks/startup.py --baseline /path/to/older/checkout --repeat 3

Times `rlfarm train --preset cartpole-ppo --total-steps 4096` from the command to its exit, with the
embedded default (a private Redis and 2 worker processes started and stopped by the run), for this
checkout and, if given, a baseline checkout (run with the same interpreter), and for this checkout
on a local farm started beforehand with `rlfarm up`. Overhead = end to end - training (summary.json's
wall_seconds) - the imports a trainer needs anyway (`import torch, celery, gymnasium` and rlfarm's
trainer, timed alone). CPU s: the CPU time of the run's whole process tree (trainer, Redis, workers),
which is what a machine full of runs (a sweep, the test suite) pays for each start. "workers not
forked": RLFARM_FORK_WORKERS=0, the embedded worker started from a fresh interpreter (which imports
torch again) instead of forked from the trainer (rlfarm.local.forked.ForkedWorker).

Then a worker's own start: `rlfarm worker -c 2` against a running Redis, from its command to its
answer to a ping, and the CPU its processes (main and pool) spent until then, for this checkout and
the baseline: what every worker machine, restart and test farm pays (a worker acting MLP policies
never imports torch: rlfarm.algos.acting).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["train", "--preset", "cartpole-ppo", "--total-steps", "4096"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(checkout: Path, env: dict[str, str], extra: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(end-to-end seconds, training seconds, CPU seconds) of one run of COMMAND in `checkout`."""
    with tempfile.TemporaryDirectory() as tmp:
        cpu = children_cpu()
        t = time.perf_counter()
        run_id = f"s{time.time_ns()}"  # a local farm's Redis keeps earlier runs
        subprocess.run(
            [sys.executable, str(checkout / "cli.py"), *COMMAND, "--logdir", tmp, "--run-id", run_id],
            check=True,
            capture_output=True,
            cwd=checkout,
            env={**env, **(extra or {})},
        )
        end_to_end = time.perf_counter() - t
        cpu = children_cpu() - cpu
        return end_to_end, json.loads((Path(tmp) / run_id / "summary.json").read_text())["wall_seconds"], cpu


def import_seconds(checkout: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, celery, gymnasium, rlfarm.trainer"], check=True, cwd=checkout)
    return time.perf_counter() - t


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_start(checkout: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds until it answers a ping, CPU seconds of its processes by then) of `rlfarm worker -c 2`
    from `checkout`, against the Redis of `env`'s RLFARM_REDIS_URL; stopped afterwards."""
    from rlfarm.farm.app import make_app

    node = f"bench{time.time_ns()}@localhost"
    app = make_app(env["RLFARM_REDIS_URL"])
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(checkout / "cli.py"), "worker", "-c", "2", "-n", node],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not app.control.ping(destination=[node], timeout=0.2):
            if proc.poll() is not None:
                raise RuntimeError(f"rlfarm worker from {checkout} exited at start")
        ready = time.perf_counter() - t
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
        cpu = sum(proc_cpu(pid) for pid in [proc.pid, *map(int, children.stdout.split())])
        return ready, cpu
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another rlfarm checkout to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp()
    env = {**os.environ, "RLFARM_HOME": home}  # no local farm, unless started below
    cases = [
        ("this checkout, embedded", ROOT, {}),
        ("this checkout, workers not forked", ROOT, {"RLFARM_FORK_WORKERS": "0"}),
    ] + ([("baseline, embedded", args.baseline, {})] if args.baseline else [])
    rows = []
    for _ in range(args.repeat):  # interleaved, so that a busy moment hits all alike
        for name, checkout, extra in cases:
            rows.append((name, import_seconds(checkout), *timed(checkout, env, extra)))
    subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "up", "-w", "2"], check=True, capture_output=True, cwd=ROOT, env=env
    )
    try:
        for _ in range(args.repeat):
            rows.append(("this checkout, on `rlfarm up`", import_seconds(ROOT), *timed(ROOT, env)))
    finally:
        subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "down"], check=True, capture_output=True, cwd=ROOT, env=env
        )
    from rlfarm.local.cluster import LocalCluster

    starts = []
    with LocalCluster(workers=0, name="bench-startup", log_dir=Path(home)) as redis_only:
        worker_env = {**env, "RLFARM_REDIS_URL": redis_only.redis_url}
        checkouts = [("this checkout", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
        for _ in range(args.repeat):
            for name, checkout in checkouts:
                starts.append((name, *worker_start(checkout, worker_env)))
    print(f"cores: {os.cpu_count()}; command: rlfarm {' '.join(COMMAND)}; medians of {args.repeat}")
    print(f"{'case':<34} {'end to end s':>13} {'training s':>11} {'imports s':>10} {'overhead s':>11} {'CPU s':>7}")
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        e2e = statistics.median(r[2] for r in mine)
        train = statistics.median(r[3] for r in mine)
        imports = statistics.median(r[1] for r in mine)
        cpu = statistics.median(r[4] for r in mine)
        print(f"{name:<34} {e2e:>13.2f} {train:>11.2f} {imports:>10.2f} {e2e - train - imports:>11.2f} {cpu:>7.2f}")
    print(f"\n`rlfarm worker -c 2` until it answers a ping; medians of {args.repeat}")
    print(f"{'checkout':<34} {'seconds':>13} {'CPU s':>11}")
    for name in dict.fromkeys(r[0] for r in starts):
        mine = [r for r in starts if r[0] == name]
        seconds, cpu = statistics.median(r[1] for r in mine), statistics.median(r[2] for r in mine)
        print(f"{name:<34} {seconds:>13.2f} {cpu:>11.2f}")


if __name__ == "__main__":
    main()
