"""`celery -A tasks worker` and `celery -A tasks flower` from the repository's root: the worker's
Celery app and its tasks are rlfarm.worker.app's (`celery -A rlfarm.worker.app worker` from anywhere)."""

from rlfarm.worker.app import app, evaluate, rollout

__all__ = ["app", "evaluate", "rollout"]
