"""`rlfarm status --watch`: a farm's snapshot (rlfarm.commands.status) shown again every interval
until Ctrl-C or SIGTERM, in place on a terminal, one after another into a pipe or a file. A watcher
outlives a Redis restart: a frame it cannot gather says so, and the next interval tries again."""

from __future__ import annotations

import sys
import time
from typing import Any

import redis
from kombu.exceptions import OperationalError

from rlfarm.commands import status as S

# What a lost Redis raises while a snapshot is gathered (redis-py directly, or kombu's inspect).
LOST = (redis.ConnectionError, redis.TimeoutError, OperationalError, ConnectionError)


def frame(client: Any, app: Any, redis_url: str, source: str, as_json: bool) -> Any:
    """One snapshot: its JSON line, or its rich tables. Raises LOST errors."""
    snap = S.gather(client, app, redis_url, source=source)
    return S.to_json(snap) if as_json else S.render(snap)


def show(console: Any, renderable: Any) -> None:
    """A frame on stdout: a JSON line as it is, tables through `console` (rich)."""
    if isinstance(renderable, str):
        print(renderable)
    else:
        console.print(renderable)
    sys.stdout.flush()  # piped output is block-buffered; a reader wants each frame now


def watch(client: Any, app: Any, redis_url: str, source: str, as_json: bool, interval: float, console: Any) -> None:
    """Frames every `interval` seconds until KeyboardInterrupt (Ctrl-C, or SIGTERM turned into it by
    the caller), which ends it normally."""
    from rich.text import Text

    from rlfarm.farm.connection import redact

    def current() -> Any:
        try:
            return frame(client, app, redis_url, source, as_json)
        except LOST:
            return Text(f"cannot reach Redis at {redact(redis_url)}; retrying every {interval:g} s", style="red")

    try:
        if console.is_terminal and not as_json:
            from rich.live import Live

            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(current(), refresh=True)
                    time.sleep(interval)
        else:  # a pipe or a file: frames one after another, each starting with its header line
            while True:
                show(console, current())
                if not as_json:
                    print(flush=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how --watch ends: exit 0, no traceback
