"""The worker's Celery app and its two tasks: `celery -A rlfarm.worker.app worker` (tasks/, at the
repository's root, re-exports it for `celery -A tasks worker` and `celery -A tasks flower`).

Tasks are thin: the kwargs are an rlfarm.core.protocol.TaskSpec; rlfarm.worker.handler checks them,
does the work and pushes the result; the worker's Celery glue (signals, time-limit reports, lease
renewal, hand-back on SIGTERM) is rlfarm.worker.hooks. The broker is found as every rlfarm command
finds it (rlfarm.farm.find): RLFARM_REDIS_URL, else the local farm of `rlfarm up` (with its secret,
put into RLFARM_SECRET for the pool processes), else redis://127.0.0.1:6379/0. So `celery -A tasks
flower` and `celery -A tasks worker` on the machine of an `rlfarm up` farm find it by themselves.
"""

from __future__ import annotations

from rlfarm.farm.app import DEFAULT_REDIS_URL, EVAL_TASK, ROLLOUT_TASK, make_app
from rlfarm.farm.find import find_farm, use_secret
from rlfarm.worker import hooks


def _broker() -> str:
    farm = find_farm(None)
    if farm.url is None:
        return DEFAULT_REDIS_URL
    mismatch = use_secret(farm)
    if mismatch:
        import logging

        logging.getLogger("rlfarm.worker").warning("%s", mismatch)
    return farm.url


# `main` names the app as it always did (Celery shows it); task names are rlfarm's own, given below.
app = make_app(_broker(), main="tasks")
hooks.install(app)


# The kwargs are the fields of rlfarm.core.protocol.TaskSpec, defined there once; `env` among them is a
# label for Flower only: the worker takes the env from the run's metadata in Redis, so a message can
# never make it build a different env than the run's.
# A task whose answer to the trainer is an error (a refusal, a failure) raises hooks.TaskFailed
# after that answer is in Redis, so Celery and Flower show it as FAILURE; the trainer reads only Redis.
@app.task(
    name=ROLLOUT_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    Request=hooks.RolloutRequest,
    throws=(hooks.TaskFailed,),
)
def rollout(self, **spec) -> None:
    """Collect `steps` env steps per sub-env with policy `version` ("latest": the newest when the
    task starts) of `run`, acting with the algorithm's options in `act`; result to Redis."""
    hooks.run(self.request)


@app.task(
    name=EVAL_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    Request=hooks.RolloutRequest,
    throws=(hooks.TaskFailed,),
)
def evaluate(self, **spec) -> None:
    """Play `episodes` greedy episodes with policy `version` of `run`; returns to Redis."""
    hooks.run(self.request)
