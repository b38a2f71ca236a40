"""The Celery configuration every rlfarm process shares: trainer (client side) and workers."""

from __future__ import annotations

from typing import Any

from celery import Celery

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ROLLOUT_TASK = "rlfarm.rollout"

# Rollouts are short next to this; a message unacked for longer is presumed lost and redelivered.
# Set identically wherever kombu reads it, or the shortest one wins.
VISIBILITY_TIMEOUT = 3600


def celery_settings(redis_url: str) -> dict[str, Any]:
    transport = {"visibility_timeout": VISIBILITY_TIMEOUT}
    return {
        "broker_url": redis_url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # No pickle anywhere: a broker writer must not be able to run code on workers.
        # json stays accepted for Celery's own remote-control and event messages.
        "task_serializer": "msgpack",
        "result_serializer": "msgpack",
        "accept_content": ["msgpack", "json"],
        "result_accept_content": ["msgpack", "json"],
        # Results travel through rlfarm's own Redis lists (see rlfarm.worker), not Celery's backend.
        "task_ignore_result": True,
        # Rollouts are long and may die with their process: ack after the work, redeliver if lost.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Task events (for Flower) cost ~1.5 ms per task; workers turn them on with -E / --events.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "broker_heartbeat": 0,
    }


def make_app(redis_url: str = DEFAULT_REDIS_URL, main: str = "rlfarm") -> Celery:
    app = Celery(main)
    app.conf.update(celery_settings(redis_url))
    return app
