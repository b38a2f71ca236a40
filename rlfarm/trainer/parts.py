"""What a trainer is made of, grouped by what travels together (rlfarm.trainer.factory builds them):
what learns, the farm as the trainer reaches it, and the run's files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    import torch

    from rlfarm.algos.base import Algorithm
    from rlfarm.envs import SpaceSpec
    from rlfarm.farm.claim import Claim
    from rlfarm.farm.outage import OutageRetry
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.trainer.channel import FarmLink


@dataclass(frozen=True)
class LearningParts:
    """What learns, and on what: the env's spaces, the torch device and threads, the learner."""

    space: SpaceSpec
    device: torch.device
    threads: int
    algo: Algorithm


@dataclass(frozen=True)
class FarmParts:
    """The farm as the trainer reaches it: the Redis client and its outage clock, the policy store, the
    run's claim, and the link its task channel and watchdog are opened from."""

    client: redis.Redis
    retry: OutageRetry
    store: PolicyStore
    claim: Claim
    link: FarmLink


@dataclass(frozen=True)
class RunIO:
    """The run's files and what it says: its directory, `open_logger(resume_state)` (the RunLogger,
    opened by train() once the run is claimed: it writes the run directory), what signs the policy
    files (RLFARM_SECRET) and the warning said at the start (rlfarm.farm.policies.store.no_secret_warning)."""

    run_dir: Path
    open_logger: Callable[[dict[str, Any] | None], RunLogger]
    file_secret: Any = None
    secret_warning: str | None = None
