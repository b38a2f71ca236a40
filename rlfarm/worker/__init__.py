"""The worker side of a farm: what `celery -A rlfarm.worker.app worker` (or `rlfarm worker`) runs.

- app.py: the Celery app and its two tasks; hooks.py: the glue Celery calls around them (signals, a
  bootstep, the request class, hand-back on SIGTERM);
- rollout.py: what a task does (checks, acting, the answer); policies.py, cache.py, machine.py: the
  policy versions it acts with; streams.py: env streams; results.py: a result's bytes and its push;
  lease.py: the task's lease;
- node.py: what a worker's main process does for its tasks; counters.py: its pool processes' counts;
- settings.py: the worker's settings, read once from the environment.

The trainer side never imports this package (tests/test_boundaries.py); both speak through
rlfarm.farm. See docs/architecture.md.
"""
