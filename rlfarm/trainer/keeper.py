"""The trainer's face to its task channel and watchdog (`RunKeeper`, the RunOwner of
rlfarm.trainer.outbox, which Trainer derives from): each method hands the question to the object that
answers it, with where the run stands. What it owns in Redis is written back by OwnedKeys
(rlfarm.trainer.ownership), the farm's numbers and the heartbeat are Heartbeat's
(rlfarm.trainer.heartbeat), the env streams' snapshots RunStreams' (rlfarm.trainer.streams). The
attributes named below are the trainer's (rlfarm.trainer.base), as are `publish` and the evaluations'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlfarm.trainer.heartbeat import RunProgress
from rlfarm.trainer.log import warn

if TYPE_CHECKING:
    from rlfarm.core.protocol import Result
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.trainer.channel import TaskChannel
    from rlfarm.trainer.heartbeat import Heartbeat
    from rlfarm.trainer.ownership import OwnedKeys
    from rlfarm.trainer.streams import RunStreams


class RunKeeper:
    """The RunOwner side of a trainer, its heartbeat and its farm numbers, handed on."""

    channel: TaskChannel
    streams: RunStreams
    owned: OwnedKeys
    heartbeats: Heartbeat
    logger: RunLogger | None
    env_steps: int
    version: int
    dropped_stale: int
    eval_mean_return: float
    policy_eval_means: dict[str, float]
    _sps: float
    _last_logged: dict[str, float]

    def publish(self) -> None:
        raise NotImplementedError  # the trainer's (rlfarm.trainer.base)

    # ---- RunOwner: what the task channel and the watchdog ask of the trainer -------------------------
    def warn(self, text: str) -> None:
        warn(text)

    def restore_run_state(self) -> None:
        self.owned.restore_run_state(self.version, self.publish)
        self.heartbeat()

    def after_outage(self) -> None:
        self.owned.after_outage()

    def rewrite_owned(self) -> None:
        self.owned.rewrite()
        self.heartbeat()

    def write_back(self, kind: str) -> str:
        return self.owned.write_back()

    def late_copy(self, message: Result) -> None:
        self.streams.late_copy(message)

    def accepted_snapshot(self, message: Result) -> None:
        self.streams.accepted(message)

    def on_event(self) -> None:
        """A task was sent or a result arrived: refresh the progress bar."""
        if self.logger:
            self.logger.status(self.env_steps, self._sps, self.version, self.channel.in_flight)

    # ---- the farm's numbers, logged, exported and in the heartbeat ----------------------------------
    def run_meta(self) -> dict[str, Any]:
        return self.owned.run_meta()

    def progress_now(self) -> RunProgress:
        return RunProgress(
            self.env_steps,
            self.version,
            self._sps,
            self.eval_mean_return,
            self.dropped_stale,
            self.policy_eval_means,
            self._last_logged,
        )

    def farm_scalars(self) -> dict[str, float]:
        return self.heartbeats.scalars()

    def metrics_labels(self) -> dict[str, str]:
        return self.heartbeats.labels()

    def live_metrics(self) -> dict[str, Any]:
        return self.heartbeats.live(self.progress_now())

    def heartbeat(self, state: str = "running", farm: Mapping[str, float] | None = None) -> None:
        self.heartbeats.beat(state, self.progress_now(), farm)
