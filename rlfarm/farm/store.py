"""PolicyStore: versioned policy checkpoints in Redis, namespaced per run.

Keys, all under `rlfarm:<run>:`
  policy:<v>      safetensors bytes (metadata: version, algo, created, sha256)
  policy:latest   the newest published version
  versions        sorted set of retained versions
  meta            the run's config as JSON, so a worker can build env and network

With RLFARM_SECRET set (rlfarm.core.signing), `meta` holds {"signed": <that JSON>, "hmac": ...} and each
policy blob's metadata an `hmac`; a store with a secret refuses unsigned or forged ones.
The other keys of a run (results, wanted, leases, pinned, status): docs/architecture.md, decision 4.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Mapping

import redis
import torch

from rlfarm.core import codec, signing


class PolicyError(LookupError):
    """A policy version that cannot be handed out."""


class PolicyNotFound(PolicyError):
    pass


class PolicyTrimmed(PolicyError):
    pass


class PolicyCorrupt(PolicyError):
    pass


class RunNotFound(LookupError):
    pass


def run_prefix(run_id: str) -> str:
    return f"rlfarm:{run_id}:"


class RedisAuthError(ConnectionError):
    """Redis answered but refused the URL's credentials (or wanted some): a configuration error."""


def connect(url: str, timeout: float = 5.0) -> redis.Redis:
    """A client that fails fast and clearly when Redis is not there."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_keepalive=True,
                                      health_check_interval=30)
        client.ping()
    except redis.AuthenticationError as exc:
        raise RedisAuthError(f"Redis at {redact(url)} refused the credentials: {exc}") from None
    except redis.ResponseError as exc:  # e.g. NOAUTH: a password is required and the URL has none
        raise RedisAuthError(f"Redis at {redact(url)} refused the connection: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
        raise ConnectionError(f"cannot reach Redis at {redact(url)}: {exc}{_tls_hint(url, exc)}") from None
    except redis.RedisError as exc:  # e.g. InvalidResponse: something else listens on that port
        raise ConnectionError(f"Redis at {redact(url)} did not answer like a Redis server: "
                              f"{type(exc).__name__}: {exc}") from None
    return client


class RedisEvicts(RuntimeError):
    """Redis is set to drop keys under memory pressure: a run's metadata, policies and queued tasks
    would vanish mid-run (seen as a flush, then as missing policy versions)."""


def eviction_policy(client: redis.Redis) -> str | None:
    """Redis's `maxmemory-policy` if it evicts keys (anything but noeviction), else None. Read from
    INFO, which managed services that disable CONFIG still answer; None if it does not say."""
    policy = str(client.info("memory").get("maxmemory_policy", "noeviction"))
    return None if policy == "noeviction" else policy


def eviction_error(client: redis.Redis, url: str) -> str | None:
    """The one line to stop on when Redis evicts keys, or None."""
    policy = eviction_policy(client)
    if policy is None:
        return None
    return (f"Redis at {redact(url)} evicts keys when memory runs short (maxmemory-policy {policy}): it "
            f"would drop a run's policies, metadata and queued tasks; set it to keep them with "
            f"`redis-cli CONFIG SET maxmemory-policy noeviction` (and `maxmemory-policy noeviction` in its "
            f"redis.conf)")


def refuse_eviction(client: redis.Redis, url: str) -> None:
    """RedisEvicts unless Redis keeps every key (maxmemory-policy noeviction)."""
    error = eviction_error(client, url)
    if error:
        raise RedisEvicts(error)


def _tls_hint(url: str, exc: Exception) -> str:
    """A plain client on a TLS port sees its connection reset; a TLS client on a plain one waits
    for a handshake that never comes. Say so, since neither message mentions TLS."""
    from urllib.parse import urlsplit

    scheme, text = urlsplit(url).scheme, str(exc)
    if scheme == "redis" and ("reading from" in text or "Connection closed" in text):
        return " (is it a TLS port? then use a rediss:// URL)"
    if scheme == "rediss" and ("WRONG_VERSION_NUMBER" in text.upper() or "Timeout connecting" in text):
        return " (does that port speak TLS? a plain one needs a redis:// URL)"
    return ""


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def is_loopback(host: str | None) -> bool:
    """localhost, 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z); any other name or address is not."""
    import ipaddress

    if not host:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False  # a host name other than localhost: not resolved, so not known to be local
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def no_password_warning(url: str) -> str | None:
    """The warning for a Redis URL without a password on a non-loopback address (anyone who can reach
    that Redis can queue work on every worker), or None: it has one, or is this machine or a socket."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "unix" or parts.password or is_loopback(parts.hostname):
        return None
    return (f"Redis at {redact(url)} accepts this worker without a password: anyone who can reach it can "
            f"queue work on every worker; give it one (requirepass) and use {parts.scheme}://:PASSWORD@host:port/db")


def no_secret_warning(url: str, secret: bytes | str | None) -> str | None:
    """The warning for a Redis off this machine without RLFARM_SECRET (its results, policies and tasks
    are then taken as they come: whoever can write to it can forge them unnoticed), or None."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if secret or parts.scheme == "unix" or is_loopback(parts.hostname):
        return None
    return (f"Redis at {redact(url)} is not on this machine and RLFARM_SECRET is not set: whoever can write "
            f"to it can forge results, policies and tasks unnoticed; give the trainer and every worker the "
            f"same secret in RLFARM_SECRET (e.g. `openssl rand -hex 32`)")


FROM_ENV: Any = object()  # PolicyStore's default secret: RLFARM_SECRET, read when the store is made


class PolicyStore:
    def __init__(self, client: redis.Redis, run_id: str, keep: int = 5,
                 secret: bytes | str | None = FROM_ENV):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.client = client
        self.run_id = run_id
        self.keep = keep
        self.prefix = run_prefix(run_id)
        # Signs what it writes and verifies what it reads (run meta, policies); None: neither.
        self.secret = signing.secret_from_env() if secret is FROM_ENV else secret
        # Versions retention never trims (the best one, those being evaluated), with their blobs, so a
        # trainer can write them back after Redis lost its data. Only the run's trainer pins.
        self.pinned: dict[int, bytes] = {}
        # The newest version this store published, as it wrote it: what it pins or writes back is its
        # own copy, never bytes read back from Redis, which anyone who can write to Redis can replace.
        self.own: tuple[int, bytes] | None = None
        self.own_meta: bytes | None = None

    def _key(self, version: int) -> str:
        return f"{self.prefix}policy:{version}"

    # ---- run metadata --------------------------------------------------------------------------
    def set_run_meta(self, meta: Mapping[str, Any]) -> None:
        text = signing.seal_run_meta(self.run_id, meta, self.secret)
        self.client.set(f"{self.prefix}meta", text)
        self.own_meta = text.encode()  # as written, to put back if it is replaced (write_back)

    def run_meta(self) -> dict[str, Any]:
        raw = self.client.get(f"{self.prefix}meta")
        if raw is None:
            raise RunNotFound(f"run {self.run_id!r} has no metadata in Redis (unknown run?)")
        return signing.open_run_meta(self.run_id, raw, self.secret)  # SignatureError if forged

    # ---- versions ------------------------------------------------------------------------------
    def publish(self, version: int, state: Mapping[str, torch.Tensor], algo: str,
                extra: Mapping[str, str] | None = None) -> bytes:
        """Store `version` and move `latest` to it in one transaction; trim beyond `keep`."""
        latest = self.latest()
        if latest is not None and version <= latest:
            raise ValueError(f"version {version} is not newer than the latest ({latest})")
        meta = {"version": str(version), "algo": algo, "run": self.run_id,
                "created": f"{time.time():.6f}", **(extra or {})}
        blob = codec.encode_policy(state, meta, self.secret)
        old = [int(v) for v in self.client.zrangebyscore(f"{self.prefix}versions", "-inf",
                                                         version - self.keep)
               if int(v) not in self.pinned]
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._key(version), blob)
        pipe.zadd(f"{self.prefix}versions", {str(version): version})
        pipe.set(f"{self.prefix}policy:latest", version)
        if old:
            pipe.delete(*[self._key(v) for v in old])
            pipe.zrem(f"{self.prefix}versions", *[str(v) for v in old])
        pipe.execute()
        self.own = (version, blob)
        return blob

    def pin(self, version: int) -> bytes:
        """Keep `version` whatever `keep` says (listed in `rlfarm:<run>:pinned`); returns its blob: the
        store's own copy when it published it, else the one in Redis once it passes `get`'s checks
        (PolicyCorrupt if not): a blob forged in Redis is never pinned, nor re-signed from there."""
        if version not in self.pinned:
            if self.own is not None and self.own[0] == version:
                self.pinned[version] = self.own[1]
            else:
                blob = self.get_blob(version)
                self._check(version, blob)
                self.pinned[version] = blob
            self.client.sadd(f"{self.prefix}pinned", version)
        return self.pinned[version]

    def unpin(self, version: int) -> None:
        """Back to normal retention: trimmed now if it is older than the `keep` newest."""
        if self.pinned.pop(version, None) is None:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.srem(f"{self.prefix}pinned", version)
        latest = self.latest()
        if latest is not None and version <= latest - self.keep:
            pipe.delete(self._key(version))
            pipe.zrem(f"{self.prefix}versions", str(version))
        pipe.execute()

    def restore_pinned(self) -> None:
        """Write pinned versions back (after Redis lost its data)."""
        if not self.pinned:
            return
        pipe = self.client.pipeline(transaction=True)
        for version, blob in self.pinned.items():
            pipe.set(self._key(version), blob)
            pipe.zadd(f"{self.prefix}versions", {str(version): version})
            pipe.sadd(f"{self.prefix}pinned", version)
        pipe.execute()

    def write_back(self) -> list[str]:
        """Put back what this store wrote that Redis no longer holds as written (the run metadata, the
        newest version, pinned versions), e.g. replaced by someone without the secret, whose copy the
        workers refused. Returns what was put back ("the run metadata", "policy v3")."""
        own: dict[str, tuple[str, bytes]] = {}
        if self.own_meta is not None:
            own[f"{self.prefix}meta"] = ("the run metadata", self.own_meta)
        for version, blob in ([self.own] if self.own else []) + list(self.pinned.items()):
            own[self._key(version)] = (f"policy v{version}", blob)
        if not own:
            return []
        keys = list(own)
        pipe = self.client.pipeline(transaction=True)
        written = []
        for key, current in zip(keys, self.client.mget(keys)):
            what, blob = own[key]
            if current != blob:
                pipe.set(key, blob)
                written.append(what)
        pipe.execute()
        return written

    def latest(self) -> int | None:
        raw = self.client.get(f"{self.prefix}policy:latest")
        return None if raw is None else int(raw)

    def versions(self) -> list[int]:
        return [int(v) for v in self.client.zrange(f"{self.prefix}versions", 0, -1)]

    def get_blob(self, version: int | str) -> bytes:
        """Raw safetensors bytes of a version ('latest' allowed), with a clear error when absent."""
        if version == "latest":
            latest = self.latest()
            if latest is None:
                raise PolicyNotFound(f"run {self.run_id!r} has no published policy")
            version = latest
        version = int(version)
        blob = self.client.get(self._key(version))
        if blob is None:
            latest = self.latest()
            retained = self.versions()
            if latest is not None and version < latest and (not retained or version < retained[0]):
                raise PolicyTrimmed(
                    f"run {self.run_id!r}: policy version {version} was trimmed; retained versions "
                    f"are {retained[0]}..{retained[-1]}" if retained else
                    f"run {self.run_id!r}: policy version {version} was trimmed")
            raise PolicyNotFound(f"run {self.run_id!r}: no policy version {version} "
                                 f"(latest is {latest})")
        return blob

    def get(self, version: int | str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and metadata of a version ('latest' allowed), checked: sha256, the hmac when the
        store has a secret, and that the blob is the version (and run) of the key it was read from."""
        if version == "latest":
            latest = self.latest()
            version = "latest" if latest is None else latest  # None: get_blob raises a clear error
        return self._check(version, self.get_blob(version))

    def _check(self, version: int | str, blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        try:
            state, meta = codec.decode_policy(blob, self.secret)
        except codec.CodecError as exc:
            raise PolicyCorrupt(f"run {self.run_id!r}: policy version {version} is corrupt: {exc}") from None
        claimed, run = meta.get("version"), meta.get("run")
        if claimed != str(int(version)):
            raise PolicyCorrupt(f"run {self.run_id!r}: policy stored as v{int(version)} but claims "
                                f"v{claimed}: refusing it")
        if run is not None and run != self.run_id:
            raise PolicyCorrupt(f"run {self.run_id!r}: policy version {version} belongs to run {run!r}: "
                                f"refusing it")
        return state, meta

    def info(self, version: int) -> dict[str, str]:
        meta = codec.policy_metadata(self.get_blob(version))
        meta["bytes"] = str(len(self.client.get(self._key(version)) or b""))
        return meta


class PolicyCache:
    """Per-process LRU of decoded policies keyed by (run, version): a version is fetched once."""

    def __init__(self, size: int = 4):
        self.size = size
        self._items: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def get(self, key: tuple[str, int]) -> Any | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: tuple[str, int], value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def drop_run(self, run: str) -> None:
        """Forget every version of `run` (a new trainer of that run id: rlfarm.farm.claim)."""
        for key in [k for k in self._items if k[0] == run]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)


def list_runs(client: redis.Redis) -> list[str]:
    runs = set()
    for key in client.scan_iter(match="rlfarm:*:meta", count=500):
        runs.add(key.decode().split(":", 2)[1] if isinstance(key, bytes) else key.split(":", 2)[1])
    return sorted(runs)


def run_exists(client: redis.Redis, run_id: str) -> bool:
    """A run is known to this Redis when it has metadata or retained policy versions."""
    prefix = run_prefix(run_id)
    return bool(client.exists(f"{prefix}meta") or client.zcard(f"{prefix}versions"))


def _glob_escape(text: str) -> str:
    """`text` as a literal inside a SCAN MATCH pattern (a run id '*' must not match every run)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def delete_run(client: redis.Redis, run_id: str, batch: int = 500) -> int:
    """Remove every key under `rlfarm:<run>:` (policies, versions, meta, status, pending results);
    returns how many were removed. SCAN + UNLINK in batches: Redis never blocks on one big call."""
    removed = 0
    keys: list[bytes] = []
    for key in client.scan_iter(match=_glob_escape(run_prefix(run_id)) + "*", count=batch):
        keys.append(key)
        if len(keys) >= batch:
            removed += int(client.unlink(*keys))
            keys.clear()
    if keys:
        removed += int(client.unlink(*keys))
    return removed


# ---- trainer heartbeat ------------------------------------------------------------------------
STATUS_TTL = 120  # seconds; a trainer that stops writing drops out of `rlfarm status` by itself
CELERY_QUEUE = "celery"  # Celery's default queue: a Redis list of waiting task messages


def write_status(client: redis.Redis, run_id: str, fields: Mapping[str, Any]) -> None:
    """The trainer's live state (`rlfarm:<run>:status`), refreshed every log interval with a TTL."""
    key = f"{run_prefix(run_id)}status"
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
    pipe.expire(key, STATUS_TTL)
    pipe.execute()


def read_status(client: redis.Redis, run_id: str) -> dict[str, str]:
    raw = client.hgetall(f"{run_prefix(run_id)}status")
    return {k.decode(): v.decode() for k, v in raw.items()}


def queue_depth(client: redis.Redis, queue: str = CELERY_QUEUE) -> int:
    """Task messages waiting in the broker queue (not yet taken by a worker process)."""
    return int(client.llen(queue))


# ---- task bookkeeping shared by the dispatcher (trainer) and the workers ----------------------------
# rlfarm:<run>:results          list of result messages (msgpack); the trainer BLPOPs it
# rlfarm:<run>:wanted           set of the task keys whose result the trainer still wants, plus LIVE
#                               while the run's trainer lives; a worker skips any other task unrun
# rlfarm:<run>:lease:<task key> the worker identity running a copy of that task; a short expiry its
#                               worker keeps renewing, so an expired lease means a lost worker
LIVE = "*"


def results_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}results"


def wanted_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}wanted"


def task_key_text(kind: str, iteration: int, index: int) -> str:
    return f"{kind}:{iteration}:{index}"


def lease_key(run_id: str, key_text: str) -> str:
    return f"{run_prefix(run_id)}lease:{key_text}"
