"""A farm's Redis URL, plain or through Redis Sentinel, and the clients made from it.

A plain URL is redis-py's: `redis://[:PASSWORD@]host:port/db`, `rediss://...`, `unix:///path`.
A Sentinel URL lists the sentinels, as kombu does, separated by `;`:

    sentinel://[:PASSWORD@]host1:26379;sentinel://host2:26379;sentinel://host3:26379/0?master_name=rlfarm

`master_name` (required), the db and the password may sit on any one of them; the password is the
master's (and its replicas'); `sentinel_password` in the query is the sentinels' own, if they have
one. Every client rlfarm makes asks the sentinels for the master when it connects, so after a
failover a reconnect reaches the new master: the policy store, results and leases (redis-py's
Sentinel), and the broker (kombu's sentinel transport, `celery_transport`). TLS to a Sentinel-managed
master is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a `sentinel://` URL; ValueError naming what is wrong."""
    sentinels: list[tuple[str, int]] = []
    found: dict[str, str] = {}
    db: int | None = None
    username = password = None
    for part in (p.strip() for p in url.split(";") if p.strip()):
        parts = urlsplit(part)
        if parts.scheme.lower() != SENTINEL_SCHEME:
            raise ValueError(f"every address of a Sentinel URL starts with sentinel:// (got {part!r})")
        if not parts.hostname:
            raise ValueError(f"no host in {part!r}")
        try:
            port = parts.port or DEFAULT_SENTINEL_PORT
        except ValueError:
            raise ValueError(f"bad port in {part!r}") from None
        sentinels.append((parts.hostname, port))
        if parts.password and password is None:  # an empty one (":@") is none
            username, password = parts.username or None, parts.password
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"the db of a Sentinel URL is a number (got {path!r})")
            db = int(path) if db is None else db
        for key, value in parse_qsl(parts.query):
            if key not in ("master_name", "sentinel_password"):
                raise ValueError(f"unknown Sentinel URL parameter {key!r} (known: master_name, sentinel_password)")
            found.setdefault(key, value)
    if not sentinels:
        raise ValueError("a Sentinel URL names at least one sentinel://host:port")
    if not found.get("master_name"):
        raise ValueError(
            "a Sentinel URL needs ?master_name=NAME (the name the sentinels monitor the "
            "master under), e.g. sentinel://h1:26379;sentinel://h2:26379/0?master_name=rlfarm"
        )
    return SentinelURL(
        tuple(sentinels), found["master_name"], db or 0, username, password, found.get("sentinel_password")
    )


def hosts(url: str) -> list[str | None]:
    """The host names a URL connects to first: the sentinels', or the one server's."""
    if is_sentinel(url):
        return [host for host, _ in parse_sentinel(url).sentinels]
    return [urlsplit(url).hostname]


def has_password(url: str) -> bool:
    """Whether the URL carries a password (an empty one, `redis://:@host`, is none)."""
    if is_sentinel(url):
        return bool(parse_sentinel(url).password)
    return bool(urlsplit(url).password)


def scheme(url: str) -> str:
    return urlsplit(url.split(";", 1)[0]).scheme.lower()


class FollowingConnection(SentinelManagedConnection):
    """Asks the sentinels for the master at every connection attempt. redis-py's own reconnects a
    dropped connection (`connect_check_health`, under the client's Retry) to the address it had:
    after a failover that is the dead master, tried until the outage limit (tests/test_sentinel.py)."""

    def _connect(self):  # type: ignore[no-untyped-def]
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()


def client(url: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client for `url`; `kwargs` are the connection's (timeouts, retry, keepalive).

    Through Sentinel the master is looked up at every (re)connect; the sentinels themselves are asked
    once each with short timeouts and no retries, so a dead sentinel costs a refused connection, not
    the master connection's outage clock."""
    if not is_sentinel(url):
        if scheme(url) not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"a Redis URL starts with redis://, rediss://, unix:// or sentinel:// (got {scheme(url) or 'none'}://)"
            )
        return redis.Redis.from_url(url, **kwargs)
    target = parse_sentinel(url)
    timeout = kwargs.get("socket_connect_timeout") or 5.0
    sentinel_kwargs = {"socket_connect_timeout": timeout, "socket_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    manager = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(
        target.master_name,
        db=target.db,
        username=target.username,
        password=target.password,
        connection_class=FollowingConnection,
        **kwargs,
    )


def celery_transport(url: str) -> tuple[str, dict[str, Any]]:
    """The broker URL and transport options kombu needs for `url`. A Sentinel URL becomes kombu's form:
    the sentinels joined by `;`, each with the password and db (kombu reads them from the first), and
    `master_name` (and the sentinels' password) as transport options, where kombu and Flower look."""
    if not is_sentinel(url):
        return url, {}
    target = parse_sentinel(url)
    auth = ""
    if target.password is not None:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password, safe='')}@"
    broker = ";".join(f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)
    options: dict[str, Any] = {"master_name": target.master_name}
    if target.sentinel_password:
        options["sentinel_kwargs"] = {"password": target.sentinel_password}
    return broker, options
