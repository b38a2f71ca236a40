"""The Celery app: `celery -A tasks worker` finds `tasks.app`.

Tasks are thin: decode the spec, hand it to rlfarm.worker, which does the work and pushes the result.
The broker comes from RLFARM_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import os

from celery.signals import worker_process_init

from rlfarm.celery_app import DEFAULT_REDIS_URL, EVAL_TASK, ROLLOUT_TASK, make_app

app = make_app(os.environ.get("RLFARM_REDIS_URL", DEFAULT_REDIS_URL), main="tasks")

_worker = None


@worker_process_init.connect
def _init_process(**_: object) -> None:
    # One torch thread per pool process: W processes on W cores, no oversubscription.
    # Workers never touch CUDA: it cannot be re-initialised in a forked child.
    import torch

    torch.set_num_threads(1)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _rollout_worker():
    global _worker
    if _worker is None:
        from rlfarm.worker import RolloutWorker

        _worker = RolloutWorker(app.conf.broker_url)
    return _worker


def _run(request_id: str, run: str, iteration: int, index: int, version: int | str, seed: int, steps: int,
         kind: str, epsilon: float | None, episodes: int) -> None:
    spec = {"run": run, "iteration": iteration, "index": index, "version": version, "steps": steps,
            "seed": seed, "kind": kind, "epsilon": epsilon, "episodes": episodes}
    _rollout_worker().handle(spec, request_id)


# `env` in both signatures is a label for Flower only: the worker takes the env from the run's
# metadata in Redis, so a message can never make it build a different env than the run's.
@app.task(name=ROLLOUT_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def rollout(self, run: str, iteration: int, index: int, version: int | str, seed: int, steps: int = 0,
            kind: str = "rollout", epsilon: float | None = None, episodes: int = 0,
            env: str | None = None) -> None:
    """Collect `steps` env steps per sub-env (or `episodes` greedy episodes when kind is "eval")
    with policy `version` ("latest": the newest when the task starts) of `run`; result to Redis."""
    _run(self.request.id, run, iteration, index, version, seed, steps, kind, epsilon, episodes)


@app.task(name=EVAL_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def evaluate(self, run: str, iteration: int, index: int, version: int | str, seed: int, episodes: int,
             kind: str = "eval", env: str | None = None) -> None:
    """Play `episodes` greedy episodes with policy `version` of `run`; returns to Redis."""
    _run(self.request.id, run, iteration, index, version, seed, 0, "eval", None, episodes)
