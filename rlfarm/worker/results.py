"""A task's answer on its way to the trainer: its bytes (compressed as the run asks, refused when too
large), what its error says about the inputs that failed their checks, and its push onto the run's
results list `rlfarm:<run>:results`, where the trainer BLPOPs it: popping is consuming, so nothing is
left behind in Redis, and large results never pass through Celery's pub/sub result path."""

from __future__ import annotations

import logging
from typing import Any

import redis

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.errors import PolicyCorrupt, ResultTooLarge
from rlfarm.farm.delivery import deliver
from rlfarm.farm.outage import is_oom

log = logging.getLogger("rlfarm.worker")


def encode_result(result: Result, farm: dict[str, Any]) -> bytes:
    """The result's bytes as the run's `farm.compress` asks, refused when too large for Redis or for
    the trainer to decode."""
    message = result.to_message()
    decoded = codec.array_bytes(message)
    if decoded > codec.MAX_DECODED_BYTES:  # the trainer would refuse to decompress it
        raise ResultTooLarge(
            f"the result's arrays hold {_mib(decoded)}, over the {_mib(codec.MAX_DECODED_BYTES)} a trainer "
            f"decodes from one result; make tasks smaller (fewer env.num_envs or farm.steps_per_env)"
        )
    # A run meta without the key was written by a trainer older than compression, which could not
    # decode a compressed array (an unknown msgpack extension): such runs get raw arrays.
    payload = codec.pack(message, compress=farm.get("compress", "none"))
    limit = int(farm.get("max_result_bytes", 0))
    if limit and len(payload) > limit:  # what goes into Redis: the compressed size
        raise ResultTooLarge(
            f"the result is {_mib(len(payload))}, over farm.max_result_bytes ({_mib(limit)}); "
            f"make tasks smaller (fewer env.num_envs or farm.steps_per_env) or raise the limit"
        )
    return payload


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def refused_input(exc: BaseException) -> str | None:
    """Which of a task's inputs failed its checks, if that is why the task failed: "spec" (its
    signature), "meta" (the run metadata's) or "policy" (the blob's hmac, sha256, version or run)."""
    if isinstance(exc, PolicyCorrupt):
        return "policy"
    if isinstance(exc, signing.SignatureError):  # signing names what it checked: "task spec", "metadata"
        return "spec" if "task spec" in str(exc) else "meta"
    return None


def push(
    client: redis.Redis,
    secret: bytes | None,
    run: str,
    message: dict[str, Any] | bytes,
    attempts_key: str,
    lease: str | None = None,
    done: str | None = None,
    stream_snapshot: tuple[str, bytes] | None = None,
) -> None:
    """Result, attempts counter, lease and `wanted` entry in one transaction: the trainer never
    sees a lease gone before its result is there, and from now on every other copy of the
    task (`done`) is skipped unrun. An env stream's snapshot goes in the same transaction, so
    the result that names it never arrives without it. A run that ended meanwhile gets nothing
    (rlfarm.farm.delivery)."""
    payload = signing.seal_result(run, message if isinstance(message, bytes) else codec.pack(message), secret)
    try:
        deliver(
            client,
            run,
            payload,
            delete=(attempts_key, *([lease] if lease else [])),
            done=done,
            stream_snapshot=stream_snapshot,
        )
    except redis.ResponseError as exc:
        if not is_oom(exc):
            raise
        # Nothing smaller would fit either (noeviction refuses every write past maxmemory); the
        # trainer's own writes fail the same way and it says so in one line.
        log.error(
            "cannot push the result of %s to run %s: Redis is out of memory (%s); free memory or raise its maxmemory",
            attempts_key.rsplit(":", 1)[-1],
            run,
            exc,
        )
