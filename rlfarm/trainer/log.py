"""The trainer's logger, and its one-line warnings: what every part of the trainer says goes here."""

from __future__ import annotations

import logging

log = logging.getLogger("rlfarm.trainer")


def warn(text: str) -> None:
    """A fault the run rides out: one `rlfarm: warning:` line on stderr and in the run's rlfarm.log
    (rlfarm.runio.logs)."""
    log.warning("%s", text)
