"""The trainer: publish -> dispatch -> gather -> update -> log, in one of two loops.

SYNC (`SyncTrainer`, rlfarm.trainer.sync) and ASYNC (`AsyncTrainer`, rlfarm.trainer.asynchronous) over
a shared base (rlfarm.trainer.base), which carries out the pure evaluation bookkeeping
(rlfarm.evaluation.bookkeeping);
`make_trainer` (rlfarm.trainer.factory) builds a trainer's collaborators and passes them in;
summary.json and `TrainResult` are rlfarm.trainer.summary, the checkpoint file rlfarm.trainer.resume.
The trainers schedule; the algorithm (rlfarm.algos.base.Algorithm) learns: nothing here knows which
algorithm runs. See docs/architecture.md.

Only re-exports, resolved on first use: importing a submodule (summary, resume) does not import
torch, Redis and Celery through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "make_trainer": "factory",
    "resolve_device": "factory",
    "Trainer": "base",
    "LogStep": "base",
    "SyncTrainer": "sync",
    "AsyncTrainer": "asynchronous",
    "auto_policy_lag": "asynchronous",
    "TrainResult": "summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from rlfarm.trainer.asynchronous import AsyncTrainer, auto_policy_lag
    from rlfarm.trainer.base import LogStep, Trainer
    from rlfarm.trainer.factory import make_trainer, resolve_device
    from rlfarm.trainer.summary import TrainResult
    from rlfarm.trainer.sync import SyncTrainer
