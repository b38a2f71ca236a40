"""The Celery configuration every rlfarm process shares: trainer (client side) and workers."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from celery import Celery

from rlfarm.core.protocol import (  # noqa: F401 - the task names live with the protocol
    EVAL_TASK,
    ROLLOUT_TASK,
    TASK_QUEUE,
)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Rollouts are short next to this; a message unacked for longer is presumed lost and redelivered.
# Set identically wherever kombu reads it, or the shortest one wins.
VISIBILITY_TIMEOUT = 3600


_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def broker_ssl(redis_url: str) -> dict[str, Any] | None:
    """TLS options for the broker from a rediss:// URL's ssl_* query parameters.

    kombu alone would fall back to CERT_NONE on a rediss:// URL without ssl_cert_reqs, while
    redis-py (policy store, results) verifies by default; deriving them here makes the broker
    verify the server certificate exactly as the other clients do.
    """
    parts = urlsplit(redis_url)
    if parts.scheme != "rediss":
        return None
    query = {k: v for k, v in parse_qsl(parts.query) if k.startswith("ssl_")}
    reqs = query.get("ssl_cert_reqs", "required")
    options: dict[str, Any] = {"ssl_cert_reqs": _CERT_REQS.get(reqs.lower().removeprefix("cert_"))}
    if options["ssl_cert_reqs"] is None:
        raise ValueError(f"ssl_cert_reqs must be one of required, optional, none (got {reqs!r})")
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query:
            options[key] = query[key]
    if "ssl_check_hostname" in query:
        options["ssl_check_hostname"] = query["ssl_check_hostname"].lower() not in ("false", "0", "no")
    return options


FARM_URL_SETTING = "rlfarm_redis_url"


def farm_url(app: Celery) -> str:
    """The farm's Redis URL an app was configured with (for a Sentinel URL, not kombu's broker form)."""
    return app.conf.get(FARM_URL_SETTING) or app.conf.broker_url


def celery_settings(redis_url: str) -> dict[str, Any]:
    """Every setting rlfarm gives Celery, from the farm's URL (plain or Sentinel)."""
    from rlfarm.farm.redis_url import celery_transport

    broker_url, sentinel = celery_transport(redis_url)  # Sentinel: kombu's URL form and master_name
    transport = {"visibility_timeout": VISIBILITY_TIMEOUT, **sentinel}
    return {
        FARM_URL_SETTING: redis_url,  # the URL as given: what rlfarm's own clients connect with
        "broker_url": broker_url,
        "broker_use_ssl": broker_ssl(redis_url),
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # Tasks of this protocol go to, and workers consume, this protocol's queue only: a worker of
        # another rlfarm version listens elsewhere and never takes them (decision 16).
        "task_default_queue": TASK_QUEUE,
        # No pickle anywhere: a broker writer must not be able to run code on workers.
        # json stays accepted for Celery's own remote-control and event messages.
        "task_serializer": "msgpack",
        "result_serializer": "msgpack",
        "accept_content": ["msgpack", "json"],
        "result_accept_content": ["msgpack", "json"],
        # Results travel through rlfarm's own Redis lists (see rlfarm.worker.results), not Celery's backend.
        "task_ignore_result": True,
        # Rollouts are long and may die with their process: ack after the work, redeliver if lost.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Task events (for Flower) cost time on every task; workers turn them on with -E / --events.
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


# The broker queue of this protocol's tasks: a Redis list of waiting task messages (kombu's).
CELERY_QUEUE = TASK_QUEUE


def queue_depth(client: Any, queue: str = CELERY_QUEUE) -> int:
    """Task messages waiting in the broker queue (not yet taken by a worker process)."""
    return int(client.llen(queue))
