"""What the trainer owns of its run in Redis, written back (`OwnedKeys`, an object the trainer holds):
when Redis lost it (a FLUSHALL, a restart without its data, a failover to a replica behind) or someone
else changed it (a forged key, a refused policy, metadata or spec). Everything comes from the copies
the store keeps of what it wrote, never from bytes read back from Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlfarm.config import to_dict
from rlfarm.core.protocol import PROTOCOL

if TYPE_CHECKING:
    from rlfarm.config import RunConfig
    from rlfarm.envs import SpaceSpec
    from rlfarm.farm.claim import Claim
    from rlfarm.farm.policies.store import PolicyStore


class OwnedKeys:
    """The run's metadata and policy versions as the trainer wrote them (`store`'s copies); `warn`
    says what was written back."""

    def __init__(
        self, config: RunConfig, space: SpaceSpec, store: PolicyStore, claim: Claim, warn: Callable[[str], None]
    ):
        self.config, self.space, self.store, self.claim, self.warn = config, space, store, claim, warn

    def run_meta(self) -> dict[str, Any]:
        """What workers read of the run; `incarnation` tells this trainer's run from an earlier one of
        the same id, whose cached metadata and policies a worker must not use."""
        return {
            "config": to_dict(self.config),
            "space": self.space.to_dict(),
            "incarnation": self.claim.incarnation,
            "protocol": PROTOCOL,
        }

    def restore_run_state(self, version: int, publish: Callable[[], None]) -> None:
        """The run's metadata vanished from Redis: write back what the trainer owns, so workers can go
        on building the env and fetching the policy (`publish`: the trainer publishes `version` anew
        when the store holds no copy of it)."""
        self.warn(
            f"run {self.config.run_id}'s state is gone from Redis (flushed, or restarted without "
            f"its data): writing back its metadata and policy v{version}, re-sending lost tasks"
        )
        self.store.set_run_meta(self.run_meta())
        self.store.restore_pinned()  # the best version and those being evaluated
        if self.store.own is not None and self.store.own[0] >= version:
            self.store.restore_newest()  # the version it published, from its own copy
        else:
            publish()

    def after_outage(self) -> None:
        """Redis was away and is back. Back as a replica promoted by a Sentinel failover, it may lack
        the newest writes (replication is asynchronous): put back the newest policy version and the
        pinned ones, which tasks sent before the failover may name (the watchdog re-lists its
        pending tasks as wanted and re-sends those lost)."""
        restored = self.store.restore_newest()
        self.store.restore_pinned()
        if restored is not None:
            self.warn(
                f"Redis came back without policy v{restored} of run {self.config.run_id} (a replica "
                f"promoted before it had copied it): wrote it back"
            )

    def rewrite(self) -> None:
        """A key of the run was found as the trainer did not write it (rlfarm.farm.guard): put back
        every key it owns from its own copies (metadata, newest and pinned versions)."""
        written = self.store.write_back()
        self.store.restore_newest()
        self.store.restore_pinned()
        if written:
            self.warn(f"wrote back {' and '.join(written)} of run {self.config.run_id} from the trainer's own copy")

    def write_back(self) -> str:
        """A worker refused the run's metadata, a policy or a task spec (rlfarm.trainer.watchdog): put back
        what the trainer wrote, from its own copies, where Redis holds something else."""
        written = self.store.write_back()
        return f"wrote back {' and '.join(written)} from the trainer's own copy; " if written else ""
