"""Everything that talks to Redis and Celery: the run's keys, connections, the policy store, the
Celery app, sending tasks and taking results in (dispatch), liveness (claim, leases, outages) and what
a task does on a worker. See docs/architecture.md."""
