"""Connecting to a farm's Redis: a client that fails fast and says why (unreachable, credentials, TLS
port mismatch, not a Redis), the settings a farm refuses (an evicting Redis), URLs without their
password, and the warnings for a Redis off this machine without a password or a secret.
"""

from __future__ import annotations

import redis
from redis.sentinel import MasterNotFoundError

from rlfarm.errors import RedisAuthError, RedisEvicts
from rlfarm.farm import redis_url


def connect(url: str, timeout: float = 5.0) -> redis.Redis:
    """A client that fails fast and clearly when Redis is not there."""
    try:
        client = redis_url.client(url, socket_connect_timeout=timeout, socket_keepalive=True, health_check_interval=30)
        client.ping()
    except redis.AuthenticationError as exc:
        raise RedisAuthError(f"Redis at {redact(url)} refused the credentials: {exc}") from None
    except redis.ResponseError as exc:  # e.g. NOAUTH: a password is required and the URL has none
        raise RedisAuthError(f"Redis at {redact(url)} refused the connection: {exc}") from None
    except MasterNotFoundError:
        target = redis_url.parse_sentinel(url)
        raise ConnectionError(
            f"cannot reach Redis at {redact(url)}: no sentinel there names a master "
            f"{target.master_name!r} (none answered, or they monitor it under another "
            f"name: `redis-cli -p 26379 SENTINEL MASTERS` lists theirs)"
        ) from None
    except ValueError as exc:
        raise ConnectionError(f"bad Redis URL {redact(url)}: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise ConnectionError(f"cannot reach Redis at {redact(url)}: {exc}{_tls_hint(url, exc)}") from None
    except redis.RedisError as exc:  # e.g. InvalidResponse: something else listens on that port
        raise ConnectionError(
            f"Redis at {redact(url)} did not answer like a Redis server: {type(exc).__name__}: {exc}"
        ) from None
    return client


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
    return (
        f"Redis at {redact(url)} evicts keys when memory runs short (maxmemory-policy {policy}): it "
        f"would drop a run's policies, metadata and queued tasks; set it to keep them with "
        f"`redis-cli CONFIG SET maxmemory-policy noeviction` (and `maxmemory-policy noeviction` in its "
        f"redis.conf)"
    )


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
    """The URL without its password, for messages and logs (each address of a Sentinel URL)."""
    from urllib.parse import urlsplit, urlunsplit

    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
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


def _all_loopback(url: str) -> bool:
    """Every address the URL names is this machine (for Sentinel: every sentinel's)."""
    return all(is_loopback(host) for host in redis_url.hosts(url))


def no_password_warning(url: str) -> str | None:
    """The warning for a Redis URL without a password on a non-loopback address (anyone who can reach
    that Redis can queue work on every worker), or None: it has one, or is this machine or a socket."""
    scheme = redis_url.scheme(url)
    if scheme == "unix" or redis_url.has_password(url) or _all_loopback(url):
        return None
    return (
        f"Redis at {redact(url)} accepts this worker without a password: anyone who can reach it can "
        f"queue work on every worker; give it one (requirepass) and use {scheme}://:PASSWORD@host:port/db"
    )


def no_secret_warning(url: str, secret: bytes | str | None) -> str | None:
    """The warning for a Redis off this machine without RLFARM_SECRET (its results, policies and tasks
    are then taken as they come: whoever can write to it can forge them unnoticed), or None."""
    if secret or redis_url.scheme(url) == "unix" or _all_loopback(url):
        return None
    return (
        f"Redis at {redact(url)} is not on this machine and RLFARM_SECRET is not set: whoever can write "
        f"to it can forge results, policies and tasks unnoticed; give the trainer and every worker the "
        f"same secret in RLFARM_SECRET (e.g. `openssl rand -hex 32`)"
    )
