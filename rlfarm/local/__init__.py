"""Farms on this machine: the embedded default a run starts for itself (cluster) and the persistent
one of `rlfarm up` (farm). Real redis-server and Celery worker processes on 127.0.0.1."""
