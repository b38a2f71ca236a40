"""What the trainer and the workers both speak, over Redis and Celery: the run's keys, connections,
the policy store, the Celery app's configuration, which farm a command works on (find), shares,
liveness (claim, leases, outages), and the trainer's sending of tasks and taking results in
(dispatch). The worker side is rlfarm.worker, which this package never imports. See
docs/architecture.md."""
