"""What both trainer loops share: the run's lifecycle (claim, resume, loop, final save), publishing,
carrying out evaluation decisions, checkpoints.

A trainer gets its collaborators (Redis client and its outage clock, policy store, claim, the link to
the farm, learner, evaluation bookkeeping, a factory of its RunLogger) from rlfarm.trainer.factory:
building one does no I/O. It opens its task channel and watchdog (rlfarm.trainer.channel) from the
link as their owner (RunOwner), and hands each question they ask to the part that answers it. The
loops are `train_loop` of SyncTrainer (rlfarm.trainer.sync) and AsyncTrainer
(rlfarm.trainer.asynchronous). See docs/architecture.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlfarm.algos.saved import describe_policy
from rlfarm.config import RunConfig
from rlfarm.core import codec
from rlfarm.core.protocol import Result
from rlfarm.errors import ConfigError, PolicyCorrupt
from rlfarm.evaluation.bookkeeping import Evaluations
from rlfarm.runio import logs
from rlfarm.trainer import resume as checkpoint
from rlfarm.trainer.evaluating import EvaluationRunner
from rlfarm.trainer.heartbeat import Heartbeat, RunProgress
from rlfarm.trainer.log import log, warn
from rlfarm.trainer.ownership import OwnedKeys
from rlfarm.trainer.parts import FarmParts, LearningParts, RunIO
from rlfarm.trainer.selfplay import SelfPlay
from rlfarm.trainer.streams import RunStreams
from rlfarm.trainer.summary import TrainResult, write_final_policy
from rlfarm.trainer.summary import build as build_summary
from rlfarm.trainer.summary import write as write_summary

if TYPE_CHECKING:
    from rlfarm.observe.metrics import RunLogger


@dataclass
class LogStep:
    """What a training callback sees after each log step (`rlfarm.train(callback=...)`)."""

    env_steps: int
    version: int
    metrics: dict[str, float]  # the row just logged: charts/..., losses/..., farm/...
    trainer: Trainer
    extra: dict[str, float] = field(default_factory=dict)  # yours to fill: logged as custom/<key>


class Trainer:
    """What both modes share: store, farm client, network, metrics, evaluation, the final save. It is
    its task channel's RunOwner (rlfarm.trainer.dispatch): each question the channel and its watchdog ask
    goes on to the part that answers it, with where the run stands."""

    # Tasks sent by a trainer before it died may still run and report under task numbers after the
    # checkpoint's; a resumed trainer numbers its ASYNC and evaluation tasks from far beyond them.
    RESUME_TASK_OFFSET = 1_000_000

    def __init__(
        self,
        config: RunConfig,
        *,
        learning: LearningParts,
        farm: FarmParts,
        io: RunIO,
        evaluations: Evaluations,
        resume: bool = False,
        callback: Callable[[LogStep], bool | None] | None = None,
    ):
        """`learning`: what learns, and on what; `farm`: the farm's parts, of which the link is what the
        trainer's task channel and watchdog are made of (the trainer opens them as their owner); `io`:
        the run's files and what it says (RunIO). `resume`: continue the run in `io.run_dir` from its
        trainer checkpoint (see rlfarm.trainer.resume). `callback(LogStep)`: called after each log
        step; returning False stops the run."""
        self.config = config
        self.run_dir = Path(io.run_dir)
        self.space = learning.space
        self.device = learning.device
        self.threads = learning.threads
        self.algo = learning.algo
        self.client = farm.client
        self.retry = farm.retry
        self.store = farm.store
        self.claim = farm.claim  # taken by train(), before the run is touched
        self.channel = farm.link.open(owner=self)  # its watchdog tells this trainer what to write back
        self.evals = evaluations
        self.open_logger = io.open_logger
        self.logger: RunLogger | None = None
        self.file_secret = io.file_secret
        self._secret_warning = io.secret_warning
        self.resume = resume
        self.callback = callback
        self.owned = OwnedKeys(config, self.space, self.store, self.claim, self.warn)  # written back
        self.heartbeats = Heartbeat(config, self.client, self.retry, self.store, self.channel, self.warn)
        # Carries out what the evaluation bookkeeping (`evals`) decides; records through the run's
        # logger, opened once the run is claimed.
        self.evaluations = EvaluationRunner(
            evaluations, config, self.store, self.channel, lambda: self.logger, self.run_dir, self.file_secret
        )
        self._stop_requested = False
        self._log_file: logging.Handler | None = None
        self.env_steps = 0
        self.version = 0
        self.dropped_stale = 0  # ASYNC: results older than async.max_policy_lag
        self.start = 0.0
        self._sps = 0.0
        self._last_logged: dict[str, float] = {}  # the last log step's metrics
        self._last_checkpoint = -math.inf
        self._target_reached_at: dict[str, float] | None = None  # when the run first saw it (summary.json)
        # farm.episodes = "continue": the run's env streams (rlfarm.core.streams); a mode sizes them.
        self.streams = RunStreams(
            self.client,
            config.run_id,
            continuing=config.farm.episodes == "continue",
            signed=self.store.secret is not None,
            stats=self.channel.stats,
            warn=self.warn,
        )
        # Turn-based games: the opponents of the learner's games, and their league (rlfarm.core.league).
        self.selfplay = SelfPlay(config, self.store) if self.space.seats > 1 else None

    # ---- RunOwner: what the task channel and its watchdog ask, handed to the part that answers ------
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

    def write_back(self, kind: str) -> str | None:
        return self.owned.write_back()

    def late_copy(self, message: Result) -> None:
        self.streams.late_copy(message)

    def accepted_snapshot(self, message: Result) -> None:
        self.streams.accepted(message)

    def on_event(self) -> None:
        """A task was sent or a result arrived: refresh the progress bar."""
        if self.logger:
            self.logger.status(self.env_steps, self._sps, self.version, self.channel.in_flight)

    def handle_eval(self, message: Result) -> None:
        """A result of an evaluation task (the channel hands over those of other groups)."""
        self.evaluations.received(message, self.env_steps)

    # ---- the farm's numbers: logged, exported, and in the heartbeat (rlfarm.trainer.heartbeat) -------
    def progress_now(self) -> RunProgress:
        return RunProgress(
            self.env_steps,
            self.version,
            self._sps,
            self.evals.mean_return,
            self.dropped_stale,
            # Several policies: each one's mean return in the last evaluation (rounded for the heartbeat).
            {name: round(value, 2) for name, value in self.evals.policy_mean.items()},
            self._last_logged,
        )

    def live_metrics(self) -> dict[str, Any]:
        return self.heartbeats.live(self.progress_now())

    def heartbeat(self, state: str = "running", farm: Mapping[str, float] | None = None) -> None:
        self.heartbeats.beat(state, self.progress_now(), farm)

    # ---- evaluations: the bookkeeping decides (evals), the runner carries out ----------------------
    def evaluate(self) -> None:
        """Greedy evaluation tasks for the current version, now."""
        self.evaluations.start(self.version, self.env_steps)

    def maybe_evaluate(self) -> None:
        self.evaluations.if_due(self.env_steps, self.version)

    def publish(self) -> None:
        # The version names its network (algorithm, head, spaces): a file made of it is read without guessing.
        self.store.publish(
            self.version,
            codec.wire_state(self.algo.state(), self.config.farm.policy_dtype),
            self.config.algo,
            {"env_steps": str(self.env_steps), **describe_policy(self.config.algo, self.space)},
        )
        if self.selfplay is not None:
            self.selfplay.published(self.version)

    def rollout_options(self, act: dict[str, Any], iteration: int, index: int) -> dict[str, Any]:
        """A rollout task's `act`: the run's options, and in a turn-based game its games' opponents."""
        return self.selfplay.opponents(act, iteration, index) if self.selfplay is not None else act

    def took_result(self, message: Result) -> None:
        """A rollout's result was accepted: what its turn-based games say of the league."""
        if self.selfplay is not None:
            self.selfplay.record(message)

    def task_options(self, progress: float) -> dict[str, Any]:
        """The `act` field of the next rollout task: the algorithm's acting options, and what it
        needs collected."""
        act = dict(self.algo.acting(progress))
        if self.algo.collect_next_obs:
            act["keep_next_obs"] = True
        if self.config.mode == "async" and self.config.async_.refresh_steps:
            act["refresh_steps"] = self.config.async_.refresh_steps
        return act

    def unused_result(self, message: Result) -> None:
        """A rollout's result that arrived once the run was over: never learned from, so not counted
        as accepted (accepted results are exactly those learned from)."""
        self.channel.unaccept(message)

    def target_reached(self) -> bool:
        """With evaluations: an evaluation reached the target and its confirmation agreed (or the
        evaluation alone, with eval.confirm_episodes = 0). Without: the rolling training return."""
        if self.config.eval.interval:
            reached = self.evals.target_reached
        else:
            reached = self.logger.rolling_return >= self.config.target_return
        if reached and self._target_reached_at is None:
            self._target_reached_at = {
                "env_steps": self.env_steps,
                "wall_seconds": round(time.perf_counter() - self.start, 3),
            }
        return reached

    # ---- checkpoints (rlfarm train --resume) ------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A mode adds its own keys; the checkpoint's keys are its format (rlfarm.trainer.resume)."""
        tensors, algo_state = self.algo.checkpoint()
        tensors["rng.torch"] = torch.get_rng_state()
        stats = self.channel.stats
        return tensors, {
            "run_id": self.config.run_id,
            "env_steps": self.env_steps,
            "version": self.version,
            **({"lines": self.store.heads} if self.store.heads else {}),
            **self.evals.state(),
            "dispatch": {
                "dispatched": stats.dispatched,
                "redispatched": stats.redispatched,
                "duplicates": stats.duplicates,
                "accepted": stats.accepted,
            },
            "algo": algo_state,
            "logger": self.logger.state(self.env_steps),
            **({"streams": self.streams.book.state()} if self.streams.book is not None else {}),
            **({"selfplay": self.selfplay.state()} if self.selfplay is not None else {}),
        }

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.algo.restore(tensors, state["algo"])
        torch.set_rng_state(tensors["rng.torch"])
        self.env_steps, self.version = state["env_steps"], state["version"]
        self.store.restore_heads(state.get("lines"))
        self.evals.restore(state, task_offset=self.RESUME_TASK_OFFSET)
        if self.streams.book is not None:
            self.streams.book.restore(state.get("streams"))
        if self.selfplay is not None:
            self.selfplay.restore(state.get("selfplay"))
        stats = self.channel.stats
        for key, value in state["dispatch"].items():
            setattr(stats, key, value)

    def save_checkpoint(self, force: bool = False) -> None:
        """At a published version, when `checkpoint_interval` seconds have passed (0: every version)."""
        now = time.perf_counter()
        if not force and now - self._last_checkpoint < self.config.checkpoint_interval:
            return
        tensors, state = self.checkpoint_state()
        checkpoint.save(self.run_dir, tensors, state)
        self._last_checkpoint = time.perf_counter()

    def _resume(self) -> dict[str, Any]:
        tensors, state = checkpoint.load(self.run_dir)
        if state["run_id"] != self.config.run_id:
            raise checkpoint.CheckpointError(f"checkpoint in {self.run_dir} belongs to run {state['run_id']!r}")
        self.restore(tensors, state)
        # A Redis that outlived the trainer may hold versions published after the checkpoint: number
        # on from the newest, so no worker ever sees two different policies under one version number.
        latest = self.store.latest()
        if latest is not None and latest >= self.version:
            self.version = latest + 1
        # Pins of the dead trainer: its evaluations are gone; the best version stays pinned if it is there.
        self.store.forget_pins()
        best = self.evals.best_version
        if best is not None and best in self.store.versions():
            try:
                self.store.pin(best)
            except PolicyCorrupt as exc:  # replaced in Redis meanwhile: not ours to keep or re-sign
                self.warn(f"not keeping the best version v{best}: {exc}")
        if self.selfplay is not None:
            dropped = self.selfplay.pin_league()
            if dropped:
                self.warn(
                    f"self-play's league lost {', '.join(f'v{v}' for v in dropped)}, which this Redis does "
                    f"not hold; it refills as versions are published"
                )
        log.info(
            "resuming run %s from its checkpoint: %d env steps, policy v%d",
            self.config.run_id,
            self.env_steps,
            self.version,
        )
        return state

    # ---- the run ----------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Run to the end; the run's messages also go to RUN_DIR/rlfarm.log, from the first one on."""
        self.claim.acquire()  # RunInUse: another trainer has the run id; nothing of it was touched
        try:
            self._log_file = logs.log_to_file(self.run_dir)
            try:
                return self._train()
            finally:
                logs.remove(self._log_file)
        finally:
            self.claim.release()

    def _train(self) -> TrainResult:
        cfg = self.config
        if self._secret_warning:
            self.warn(self._secret_warning)
        resume_state = self._resume() if self.resume else None
        if resume_state is None and self.store.latest() is not None:
            raise ConfigError(
                f"run {cfg.run_id!r} already has policies in this Redis (latest "
                f"v{self.store.latest()}); choose another --run-id, or --resume it from "
                f"its run directory"
            )
        self.store.set_run_meta(self.owned.run_meta())
        self.logger = self.open_logger(resume_state["logger"] if resume_state else None)
        elapsed = resume_state["logger"]["elapsed"] if resume_state else 0.0
        self.start = time.perf_counter() - elapsed
        self._sps = self.env_steps / elapsed if elapsed > 0 else 0.0
        state = "failed"
        try:
            self.channel.declare_queue()
            self.channel.start_share()
            self.publish()
            self.save_checkpoint(force=True)
            self.heartbeat()
            self.train_loop()
            # Every run that ends on its own (its steps, its target, its callback) evaluates its final
            # policy, so it always leaves best_policy.safetensors and its scores; Ctrl-C does not wait.
            self.evaluations.final(self.env_steps, self.version)
            self.evaluations.drain(self.env_steps, self.unused_result)
            self.save_checkpoint(force=True)
            result = self._finish(time.perf_counter() - self.start)
            state = "finished"
            self.streams.drop()
            return result
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM (the CLI's), a sweep's pruning: stopped, not failed
            state = "stopped"
            stop.rlfarm_env_steps = self.env_steps  # what the CLI says a resume does again
            raise
        finally:
            if state != "finished":
                self.retry.enabled = False  # Redis may be what failed: one attempt at the cleanup
            self.channel.close()  # the ingest thread, before Redis is told anything
            self.channel.stop_share()  # the run's slots go to the others now, whatever happens next
            try:
                self.claim.check()  # the run is another trainer's now: leave its keys alone
                self.heartbeat(state)
                # Tasks still queued are skipped by workers; results still in flight are of no use now.
                self.channel.finish()
            except Exception:  # noqa: BLE001 - Redis may be what failed; the run's own error matters
                pass
            self.logger.close()

    def train_loop(self) -> None:
        raise NotImplementedError

    def log_step(self, metrics: dict[str, float]) -> None:
        """One log step: console, CSV and TensorBoard, then the user's callback, which may stop the
        run (return False) or add metrics of its own (LogStep.extra, logged under custom/)."""
        if self.selfplay is not None:
            metrics = {**metrics, **self.selfplay.scalars()}
        self.logger.scalars(self.env_steps, metrics)
        self._last_logged = dict(metrics)
        if self.callback is None:
            return
        step = LogStep(self.env_steps, self.version, dict(metrics), self)
        if self.callback(step) is False:
            self._stop_requested = True
            log.info("run %s stopped by its callback after %d env steps", self.config.run_id, self.env_steps)
        for key, value in step.extra.items():
            if self.logger.writer:
                self.logger.writer.add_scalar(f"custom/{key}", value, self.env_steps)

    def summary_extras(self) -> dict[str, Any]:
        """What a mode adds to summary.json."""
        return {}

    def _finish(self, wall: float) -> TrainResult:
        """The final save: final_policy.safetensors, the run's result and summary.json."""
        state = self.algo.state()
        final = write_final_policy(self.run_dir, self.config, self.space, state, self.version, self.file_secret)
        best = self.run_dir / "best_policy.safetensors"
        stats = self.channel.stats
        result = TrainResult(
            run_id=self.config.run_id,
            run_dir=self.run_dir,
            env_steps=self.env_steps,
            final_version=self.version,
            policy_sha256=codec.tensor_digest(state),
            rolling_return=self.logger.rolling_return,
            best_rolling_return=self.logger.best_rolling,
            eval_mean_return=self.evals.mean_return,
            best_eval_mean_return=self.evals.best_mean_return,
            wall_seconds=wall,
            redispatched=stats.redispatched,
            duplicates=stats.duplicates,
            dropped_stale=self.dropped_stale,
            task_ids_accepted=len(stats.accepted_task_ids),
            best_version=self.evals.best_version,
            target_reached=self.target_reached(),
            final_policy=final,
            best_policy=best if self.evals.best_version is not None and best.exists() else None,
        )
        write_summary(
            self.run_dir,
            build_summary(
                result,
                stats,
                self.retry,
                target_reached_at=self._target_reached_at,
                threads=self.threads,
                extras={
                    **self.summary_extras(),
                    **({"selfplay": self.selfplay.league.to_dict()} if self.selfplay else {}),
                    **({"policies": self.evaluations.policy_summaries()} if self.evals.policy_best else {}),
                    **({"streams": self.streams.book.summary()} if self.streams.book is not None else {}),
                },
            ),
        )
        return result
