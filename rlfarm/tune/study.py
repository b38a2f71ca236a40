"""The Optuna study of a sweep, kept in the farm's Redis (Optuna's journal storage), so `rlfarm sweep`
started on several machines against one Redis works on one study; and its pruner.

The journal's keys use Optuna's default (empty) prefix: `optuna-dashboard redis://...` reads a Redis
URL as exactly this storage.
"""

from __future__ import annotations

import warnings
from typing import Any

from rlfarm.errors import SweepError

INSTALL = "pip install 'rlfarm[sweep]'"


def optuna() -> Any:
    """The optuna module, or SweepError saying how to install it."""
    try:
        import optuna as module
    except ImportError:
        raise SweepError(f"rlfarm sweep needs Optuna, which is not installed: {INSTALL}") from None
    module.logging.set_verbosity(module.logging.WARNING)  # the sweep prints its own line per trial
    warnings.filterwarnings("ignore", category=module.exceptions.ExperimentalWarning)  # the journal backend's
    return module


def storage(redis_url: str) -> Any:
    from rlfarm.farm.redis_url import is_sentinel

    if is_sentinel(redis_url):  # Optuna's journal opens its own redis-py client from a plain URL
        raise SweepError(
            "rlfarm sweep keeps its Optuna study in Redis through a plain redis:// URL; it "
            "does not follow a Sentinel failover: give --redis the master's redis:// URL"
        )
    optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalRedisBackend

    return JournalStorage(JournalRedisBackend(redis_url))


def make_pruner(name: str, warmup_steps: int, total_steps: int, below: float | None = None) -> Any:
    """median: a trial below the median of earlier trials at the same step stops, once 5 trials have
    finished and past `warmup_steps` env steps; hyperband: successive halving from `warmup_steps` to
    total_steps; threshold: a trial whose value is below `below` past `warmup_steps` stops."""
    pruners = optuna().pruners
    if name == "median":
        return pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return pruners.HyperbandPruner(
            min_resource=max(1, warmup_steps), max_resource=max(total_steps, 2), reduction_factor=3
        )
    if name == "threshold":
        return pruners.ThresholdPruner(lower=below, n_warmup_steps=warmup_steps)
    return pruners.NopPruner()


def open_study(redis_url: str, name: str, resume: bool, pruner: Any, seed: int | None) -> Any:
    """The study `name` in Redis: a new one, or with `resume` the existing one (SweepError otherwise)."""
    module = optuna()
    sampler = module.samplers.TPESampler(seed=seed)
    try:
        if resume:
            return module.load_study(study_name=name, storage=storage(redis_url), sampler=sampler, pruner=pruner)
        return module.create_study(
            study_name=name, storage=storage(redis_url), sampler=sampler, pruner=pruner, direction="maximize"
        )
    except KeyError:
        raise SweepError(f"no study {name!r} in this Redis to resume") from None
    except module.exceptions.DuplicatedStudyError:
        raise SweepError(
            f"study {name!r} already exists in this Redis: continue it with --resume {name}, or choose another --study"
        ) from None


def study_place(farm: Any, name: str) -> str:
    """Where the study of sweep `name` lives, by the farm it is on (rlfarm.farm.find.Farm; url None:
    the sweep's own embedded Redis), for the line that opens the sweep: it must name the farm the
    trials train on, not the embedded one it would have started."""
    if not farm.url:
        return "in this sweep's embedded Redis, for the sweep's life (trials.csv is its record)"
    from rlfarm.farm.connection import redact

    if farm.up:  # this machine's loopback farm, however its URL was given
        return (
            f"in the Redis of the rlfarm up farm ({redact(farm.url)}): --resume {name} continues it "
            f"while the farm is up"
        )
    return (
        f"in Redis at {redact(farm.url)} (from {farm.source}): more machines can join with the same "
        f"command and --resume {name}"
    )
