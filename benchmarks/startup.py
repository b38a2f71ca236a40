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
    print(f"cores: {os.cpu_count()}; command: rlfarm {' '.join(COMMAND)}; medians of {args.repeat}")
    print(f"{'case':<34} {'end to end s':>13} {'training s':>11} {'imports s':>10} {'overhead s':>11} {'CPU s':>7}")
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        e2e = statistics.median(r[2] for r in mine)
        train = statistics.median(r[3] for r in mine)
        imports = statistics.median(r[1] for r in mine)
        cpu = statistics.median(r[4] for r in mine)
        print(f"{name:<34} {e2e:>13.2f} {train:>11.2f} {imports:>10.2f} {e2e - train - imports:>11.2f} {cpu:>7.2f}")


if __name__ == "__main__":
    main()
