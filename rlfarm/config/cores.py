"""How a machine's cores are split between the trainer's learner threads and the embedded default's
worker processes (`torch_threads` and `farm.workers` "auto")."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig


def machine_cores() -> int:
    """Cores this process may run on (its CPU affinity, as a container's cpuset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_memory() -> int:
    """Bytes of physical memory of this machine (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


# What a worker spends per env step of a CNN run, in forwards of the network per observation: its own
# forward at a task's batch, and the emulator's step (about 0.4 of one on Pong, benchmarks/pong.py).
ACTING_FORWARDS = 1.4


def acting_share(config: RunConfig) -> float:
    """The workers' share of the CPU a CNN run's env step costs (actors and learner together), from
    the algorithm's cost model (AlgoSection.learner_forwards); 0.5 where it has none."""
    learner = config.algo_config.learner_forwards(config)
    return 0.5 if learner is None else ACTING_FORWARDS / (ACTING_FORWARDS + learner)


def local_workers(config: RunConfig, cores: int | None = None) -> int:
    """Worker processes the embedded default starts: `farm.workers`, or for 0 ("auto"):
    - SYNC: one per task of a group, up to the cores. A group is acted, then learned from, never
      both at once, so the group's tasks may take every core while they act (pong on 2 cores: 2
      workers made 415 env steps/s, 1 worker 354: docs/pong.md);
    - ASYNC: the cores' share the actors need (acting_share), at least 1. The learner paces an ASYNC
      run on one machine: a worker beyond that share would wait for it (pong, 2 epochs: 1 worker on
      2 cores, 3 on 16)."""
    if config.farm.workers:
        return config.farm.workers
    cores = cores or machine_cores()
    if config.mode == "sync":
        return max(1, min(cores, config.farm.num_tasks))
    return max(1, round(cores * acting_share(config)))


def trainer_threads(config: RunConfig, image: bool, local: int, cores: int | None = None) -> int:
    """The trainer's torch threads: `torch_threads`, or for 0 ("auto") one for MLPs (per-op overhead
    dominates at their sizes, and one thread keeps SYNC bit-reproducible) and, for CNNs, the cores
    the `local` worker processes of this run on this machine leave: each uses at most the actors'
    share of the cores (acting_share), since the learner paces them. At least 1: more threads than
    free cores slow the learner down (OpenMP threads wait for each other whenever one is
    descheduled). Pong with 2 epochs on 2 cores: 1 worker and 2 threads; with one pass: 1 and 1
    (each the faster split there, benchmarks/pong.py)."""
    if config.torch_threads:
        return config.torch_threads
    if not image:
        return 1
    cores = cores or machine_cores()
    if config.mode == "sync":  # the workers wait while the learner learns (local_workers)
        return cores
    return max(1, round(cores - min(local, cores * acting_share(config))))
