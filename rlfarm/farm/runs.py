"""A farm's runs as Redis holds them: listing, existence, deletion (`rlfarm checkpoints`), and the
trainer's heartbeat (`rlfarm:<run>:status`, read by `rlfarm status`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from rlfarm.farm import keys


def list_runs(client: redis.Redis) -> list[str]:
    return sorted({keys.run_of(key) for key in client.scan_iter(match=keys.META_PATTERN, count=500)})


def run_exists(client: redis.Redis, run_id: str) -> bool:
    """A run is known to this Redis when it has metadata or retained policy versions."""
    return bool(client.exists(keys.meta(run_id)) or client.zcard(keys.versions(run_id)))


def delete_run(client: redis.Redis, run_id: str, batch: int = 500) -> int:
    """Remove every key of the run (policies, versions, meta, status, pending results); returns how
    many were removed. SCAN + UNLINK in batches: Redis never blocks on one big call."""
    removed = 0
    found: list[bytes] = []
    for key in client.scan_iter(match=keys.run_pattern(run_id), count=batch):
        found.append(key)
        if len(found) >= batch:
            removed += int(client.unlink(*found))
            found.clear()
    if found:
        removed += int(client.unlink(*found))
    return removed


def write_status(client: redis.Redis, run_id: str, fields: Mapping[str, Any], final: bool = False) -> None:
    """The trainer's live state, refreshed every log interval with an expiry (keys.STATUS_TTL). `final`:
    the trainer's last word (finished, failed, stopped), kept without expiry, so `rlfarm status` tells a
    run that ended from one whose trainer died without a word (its heartbeat expires)."""
    key = keys.status(run_id)
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
    if final:
        pipe.persist(key)
    else:
        pipe.expire(key, keys.STATUS_TTL)
    pipe.execute()


def read_status(client: redis.Redis, run_id: str) -> dict[str, str]:
    raw = client.hgetall(keys.status(run_id))
    return {k.decode(): v.decode() for k, v in raw.items()}
