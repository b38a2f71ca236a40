"""The trainer loops: publish -> dispatch -> gather -> update -> log.

SYNC (on-policy, `SyncTrainer`): each iteration sends `farm.num_tasks` rollout tasks that all act
with version v, waits for the whole group, assembles it in task-index order, updates, and publishes
v + 1. Tasks are deterministic and the group is ordered by index, so what is learned does not depend
on how many workers there are or which finishes first.

ASYNC (`AsyncTrainer`): K tasks stay in flight, each acting with the newest version at the moment it
starts. Results are consumed in completion order; a replacement is sent at once; the algorithm takes
each result in and runs the updates it is ready for, and a new version is published every
`publish_interval` updates. Policy lag (trainer version - acting version) is recorded, and results
older than `max_policy_lag` versions are dropped and counted.

The trainers schedule; the algorithm (rlfarm.algos.base.Algorithm) learns: nothing here knows which
algorithm runs. Both send greedy evaluation tasks every `eval.interval` env steps, off the training path.
See docs/architecture.md (data flow, the algorithm interface).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from rich.console import Console

from rlfarm.core import codec, signing
from rlfarm.observe import logs
from rlfarm.trainer import resume as checkpoint
from rlfarm.algos import check_mode, learner
from rlfarm.algos.saved import describe_policy
from rlfarm.farm.app import make_app
from rlfarm.farm.claim import Claim
from rlfarm.config import ConfigError, RunConfig, check_results_per_update, to_dict, trainer_threads
from rlfarm.farm.dispatch import Dispatcher
from rlfarm.envs import describe
from rlfarm.observe.metrics import RunLogger
from rlfarm.core.protocol import PROTOCOL, Result, TaskSpec
from rlfarm.core.rollout import Rollout, concat
from rlfarm.farm.outage import OutageRetry, resilient_client
from rlfarm.observe.rundir import write_atomic
from rlfarm.farm.store import (FROM_ENV, PolicyCorrupt, PolicyStore, connect, no_secret_warning, queue_depth, redact,
                          refuse_eviction, write_status)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


@dataclass
class TrainResult:
    run_id: str
    run_dir: Path
    env_steps: int
    final_version: int
    policy_sha256: str
    rolling_return: float
    best_rolling_return: float
    eval_mean_return: float  # the last evaluation (of the final policy)
    best_eval_mean_return: float  # of best_version, over all its greedy episodes
    wall_seconds: float
    redispatched: int
    duplicates: int
    dropped_stale: int = 0
    task_ids_accepted: int = 0
    best_version: int | None = None  # the version with the best greedy evaluation (None: no evaluations)
    target_reached: bool = False
    final_policy: Path | None = None
    best_policy: Path | None = None  # RUN_DIR/best_policy.safetensors, when evaluations ran


@dataclass
class LogStep:
    """What a training callback sees after each log step (`rlfarm.train(callback=...)`)."""

    env_steps: int
    version: int
    metrics: dict[str, float]  # the row just logged: charts/..., losses/..., farm/...
    trainer: "Trainer"
    extra: dict[str, float] = field(default_factory=dict)  # yours to fill: logged as custom/<key>


@dataclass
class _Evaluation:
    env_steps: int
    version: int
    tasks: int
    confirm: bool = False  # a confirmation of an evaluation that reached the target
    returns: list[float] = field(default_factory=list)
    done: int = 0


class Trainer:
    """What both modes share: store, farm client, network, metrics, evaluation, the final save."""

    # Tasks sent by a trainer before it died may still run and report under task numbers after the
    # checkpoint's; a resumed trainer numbers its ASYNC and evaluation tasks from far beyond them.
    RESUME_TASK_OFFSET = 1_000_000

    def __init__(self, config: RunConfig, redis_url: str, run_dir: Path, console: Console | None = None,
                 resume: bool = False, callback: Callable[[LogStep], bool | None] | None = None,
                 local_workers: int = 0, secret: Any = FROM_ENV):
        """`resume`: continue the run in `run_dir` from its trainer checkpoint (see rlfarm.trainer.resume).
        `callback(LogStep)`: called after each log step; returning False stops the run.
        `local_workers`: worker processes of this run on this machine (the embedded default's), whose
        cores the trainer's threads leave to them (rlfarm.config.trainer_threads).
        `secret`: what signs and checks the run's data in Redis (default RLFARM_SECRET; the embedded
        default and `rlfarm up` make one of their own). Files in the run directory are signed with
        RLFARM_SECRET only, so they verify wherever the user's secret does."""
        self.callback = callback
        self._stop_requested = False
        check_mode(config.algo, config.mode)
        self.resume = resume
        self.config = config
        self.run_dir = Path(run_dir)
        self.console = console or Console()
        self.device = resolve_device(config.device)
        self.space = describe(config.env.id, to_dict(config)["env"])
        config.algo_config.check_spaces(self.space)
        probe = connect(redis_url)  # fails fast and clearly when Redis is not there at the start
        try:
            refuse_eviction(probe, redis_url)  # before anything is written that Redis could drop
        finally:
            probe.close()
        # From here on, every Redis command waits out an outage of up to farm.redis_outage_timeout.
        self.retry = OutageRetry(config.farm.redis_outage_timeout, where=f"Redis at {redact(redis_url)}",
                                 notify=self.warn)
        self.client = resilient_client(redis_url, self.retry)
        self.store = PolicyStore(self.client, config.run_id, keep=config.farm.keep_versions, secret=secret)
        self.file_secret = signing.secret_from_env()
        self._secret_warning = no_secret_warning(redis_url, self.store.secret)
        self.claim = Claim(self.client, config.run_id)  # taken by train(), before the run is touched
        self.app = make_app(redis_url)
        self._log = logging.getLogger("rlfarm.trainer")
        self._log_file: logging.Handler | None = None

        self.threads = trainer_threads(config, self.space.is_image, local_workers)
        torch.set_num_threads(self.threads)
        torch.manual_seed(config.seed)  # the network's initial weights
        self.algo = learner(config.algo, config.mode)(config, self.space, self.device)
        self.logger: RunLogger | None = None
        farm = config.farm
        self.dispatcher = Dispatcher(self.app, self.client, config.run_id, farm.task_timeout,
                                     farm.max_redispatch, on_event=self._on_event,
                                     env=config.env.id,  # shown in Flower's task labels
                                     lease_seconds=farm.lease_seconds, time_limit=farm.task_time_limit,
                                     retry=self.retry, on_state_lost=self.restore_run_state,
                                     notify=self.warn, claim=self.claim, secret=self.store.secret,
                                     on_unverified=self.write_back)
        self.env_steps = 0
        self.version = 0
        self.dropped_stale = 0  # ASYNC: results older than async.max_policy_lag
        self.start = 0.0
        self.wall_start = time.time()
        self._sps = 0.0
        self._evals: dict[int, _Evaluation] = {}
        self._eval_counter = 0  # evaluation numbers (task keys) are never reused, across resumes too
        self._last_checkpoint = -math.inf
        self._next_eval = config.eval.interval
        self.eval_mean_return = math.nan
        self.best_eval_mean_return = -math.inf
        self.best_version: int | None = None
        self._last_eval_version: int | None = None
        self._awaiting_confirmation: dict[int, list[float]] = {}  # version -> its first evaluation
        self._target_reached = False
        self._target_reached_at: dict[str, float] | None = None  # when the run first saw it (summary.json)

    # ---- shared pieces ---------------------------------------------------------------------------
    def warn(self, text: str) -> None:
        """A fault the run rides out: one `rlfarm: warning:` line on stderr and in the run's rlfarm.log
        (rlfarm.observe.logs)."""
        self._log.warning("%s", text)

    def restore_run_state(self) -> None:
        """The run's metadata vanished from Redis (FLUSHALL, a restart without its data): write back
        what the trainer owns, so workers can go on building the env and fetching the policy."""
        self.warn(f"run {self.config.run_id}'s state is gone from Redis (flushed, or restarted without "
                  f"its data): writing back its metadata and policy v{self.version}, re-sending lost tasks")
        self.store.set_run_meta(self.run_meta())
        self.store.restore_pinned()  # the best version and those being evaluated
        latest = self.store.latest()
        if latest is None or latest < self.version:
            self.publish()
        self.heartbeat()

    def run_meta(self) -> dict[str, Any]:
        """What workers read of the run; `incarnation` tells this trainer's run from an earlier one of
        the same id, whose cached metadata and policies a worker must not use."""
        return {"config": to_dict(self.config), "space": self.space.to_dict(),
                "incarnation": self.claim.incarnation, "protocol": PROTOCOL}

    def write_back(self, kind: str) -> str:
        """A worker refused the run's metadata, a policy or a task spec (rlfarm.farm.dispatch): put back
        what the trainer wrote, from its own copies, where Redis holds something else."""
        written = self.store.write_back()
        return f"wrote back {' and '.join(written)} from the trainer's own copy; " if written else ""

    def _on_event(self) -> None:
        if self.logger:
            self.logger.status(self.env_steps, self._sps, self.version, self.dispatcher.in_flight)

    def farm_scalars(self) -> dict[str, float]:
        """What the farm looks like from here, logged in both modes (and read by `rlfarm status`)."""
        stats = self.dispatcher.stats
        return {"farm/tasks_in_flight": self.dispatcher.in_flight,
                "farm/queue_depth": queue_depth(self.client),
                "farm/results_dropped": stats.duplicates,
                "farm/redispatched": stats.redispatched,
                "farm/leases_expired": stats.leases_expired,
                "farm/time_limits": stats.time_limits,
                "farm/redis_outages": self.retry.outages,
                **stats.security()}

    def heartbeat(self, state: str = "running", farm: dict[str, float] | None = None) -> None:
        """Refresh `rlfarm:<run>:status` (expires by itself when the trainer is gone)."""
        cfg = self.config
        farm = farm if farm is not None else self.farm_scalars()
        write_status(self.client, cfg.run_id, {
            "state": state, "mode": cfg.mode, "algo": cfg.algo, "env": cfg.env.id,
            "env_steps": self.env_steps, "total_steps": cfg.total_steps, "version": self.version,
            "sps": f"{self._sps:.1f}", "tasks_in_flight": int(farm["farm/tasks_in_flight"]),
            "eval_mean_return": f"{self.eval_mean_return:.2f}", "host": socket.gethostname(),
            **({"slots_waiting": f"{farm['farm/slots_waiting']:.3f}"} if "farm/slots_waiting" in farm else {}),
            "pid": os.getpid(), "started": f"{self.wall_start:.3f}", "updated": f"{time.time():.3f}"})

    def publish(self) -> None:
        # The version names its network (algorithm, head, spaces): a file made of it is read without guessing.
        self.store.publish(self.version, self.algo.state(), self.config.algo,
                           {"env_steps": str(self.env_steps), **describe_policy(self.config.algo, self.space)})

    def evaluate(self, confirm_version: int | None = None) -> None:
        """Send greedy evaluation tasks for one version, pinned in Redis so that retention cannot trim
        it while they run; results are logged on arrival. `confirm_version`: a confirmation of that
        version's evaluation, `eval.confirm_episodes` more episodes with other seeds."""
        cfg = self.config.eval
        confirm = confirm_version is not None
        version = confirm_version if confirm else self.version
        episodes = cfg.confirm_episodes if confirm else cfg.episodes
        number = self._eval_counter
        self._eval_counter += 1
        self.store.pin(version)
        self._evals[number] = _Evaluation(self.env_steps, version, cfg.tasks, confirm)
        if not confirm:
            self._last_eval_version = version
        per_task = math.ceil(episodes / cfg.tasks)
        for index in range(cfg.tasks):
            self.dispatcher.submit(TaskSpec(self.config.run_id, "eval", number, index, version,
                                            seed=self.config.seed + (2_000_029 if confirm else 1_000_003),
                                            episodes=per_task))

    def maybe_evaluate(self) -> None:
        interval = self.config.eval.interval
        if interval and self.env_steps >= self._next_eval:
            self.evaluate()
            while self._next_eval <= self.env_steps:
                self._next_eval += interval

    def task_options(self, progress: float) -> dict[str, Any]:
        """The `act` field of the next rollout task: the algorithm's acting options, and what it
        needs collected."""
        act = dict(self.algo.acting(progress))
        if self.algo.collect_next_obs:
            act["keep_next_obs"] = True
        if self.config.mode == "async" and self.config.async_.refresh_steps:
            act["refresh_steps"] = self.config.async_.refresh_steps
        return act

    def handle_eval(self, message: Result) -> None:
        number = message.iteration
        ev = self._evals[number]
        ev.returns += [float(r) for r in message.returns]
        ev.done += 1
        if ev.done < ev.tasks:
            return
        del self._evals[number]
        mean = float(np.mean(ev.returns))
        target = self.config.target_return
        if ev.confirm:
            # One lucky evaluation must not end the run: the target counts only once more episodes,
            # with other seeds, agree. The version's score is the mean over all its episodes.
            first = self._awaiting_confirmation.pop(ev.version)
            self.logger.evaluation(ev.env_steps, ev.returns, ev.version, confirmation=True)
            if mean >= target:
                self._target_reached = True
            self._settle(ev.version, float(np.mean(first + ev.returns)))
            return
        self.eval_mean_return = mean
        self.logger.evaluation(ev.env_steps, ev.returns, ev.version)
        if mean >= target and self.config.eval.confirm_episodes and ev.version not in self._awaiting_confirmation:
            self._awaiting_confirmation[ev.version] = ev.returns
            self.evaluate(confirm_version=ev.version)
            return
        if mean >= target:
            self._target_reached = True
        self._settle(ev.version, mean)

    def _settle(self, version: int, score: float) -> None:
        """A version's evaluation is final: keep it as the best policy if it is, else let it go."""
        if score > self.best_eval_mean_return:
            previous = self.best_version
            self.best_version, self.best_eval_mean_return = version, score
            self._write_best(version, score)
            if previous is not None and previous != version:
                self._release(previous)
        else:
            self._release(version)

    def _release(self, version: int) -> None:
        busy = {ev.version for ev in self._evals.values()} | set(self._awaiting_confirmation)
        if version != self.best_version and version not in busy:
            self.store.unpin(version)

    def _write_best(self, version: int, score: float) -> None:
        # The pinned blob is the trainer's own copy or one that passed the store's checks; verified
        # again here, since it is re-signed below (rlfarm.farm.store.PolicyStore.pin).
        state, meta = codec.decode_policy(self.store.pin(version), self.store.secret)
        meta.update({"env": self.config.env.id, "policy": json.dumps(to_dict(self.config)["policy"]),
                     "env_options": json.dumps(to_dict(self.config)["env"]),
                     "eval_mean_return": f"{score:.3f}"})
        meta.pop("hmac", None)
        blob = codec.encode_policy(state, meta, self.file_secret)
        write_atomic(self.run_dir / "best_policy.safetensors", blob)

    def drain_evaluations(self) -> None:
        """Wait for evaluation tasks still in flight (confirmations they start included), so the
        run's last evaluation is recorded."""
        while any(k[0] == "eval" for k in self.dispatcher.pending):
            message = self.dispatcher.next_result(timeout=1.0)
            if message is not None and message.kind == "eval":
                self.handle_eval(message)

    def target_reached(self) -> bool:
        """With evaluations: an evaluation reached the target and its confirmation agreed (or the
        evaluation alone, with eval.confirm_episodes = 0). Without: the rolling training return."""
        if self.config.eval.interval:
            reached = self._target_reached
        else:
            reached = self.logger.rolling_return >= self.config.target_return
        if reached and self._target_reached_at is None:
            self._target_reached_at = {"env_steps": self.env_steps,
                                       "wall_seconds": round(time.perf_counter() - self.start, 3)}
        return reached

    # ---- checkpoints (rlfarm train --resume) ------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, algo_state = self.algo.checkpoint()
        tensors["rng.torch"] = torch.get_rng_state()
        stats = self.dispatcher.stats
        return tensors, {
            "run_id": self.config.run_id, "env_steps": self.env_steps, "version": self.version,
            "next_eval": self._next_eval, "eval_counter": self._eval_counter,
            "eval_mean_return": self.eval_mean_return, "best_eval_mean_return": self.best_eval_mean_return,
            "best_version": self.best_version, "target_reached": self._target_reached,
            "dispatch": {"dispatched": stats.dispatched, "redispatched": stats.redispatched,
                         "duplicates": stats.duplicates, "accepted": stats.accepted},
            "algo": algo_state, "logger": self.logger.state(self.env_steps)}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.algo.restore(tensors, state["algo"])
        torch.set_rng_state(tensors["rng.torch"])
        self.env_steps, self.version = state["env_steps"], state["version"]
        self._next_eval = state["next_eval"]
        self._eval_counter = state["eval_counter"] + self.RESUME_TASK_OFFSET
        self.eval_mean_return = state["eval_mean_return"]
        self.best_eval_mean_return = state["best_eval_mean_return"]
        self.best_version = state.get("best_version")
        self._target_reached = state.get("target_reached", False)
        stats = self.dispatcher.stats
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
        self.client.delete(f"{self.store.prefix}pinned")
        if self.best_version is not None and self.best_version in self.store.versions():
            try:
                self.store.pin(self.best_version)
            except PolicyCorrupt as exc:  # replaced in Redis meanwhile: not ours to keep or re-sign
                self.warn(f"not keeping the best version v{self.best_version}: {exc}")
        self._log.info("resuming run %s from its checkpoint: %d env steps, policy v%d", self.config.run_id,
                       self.env_steps, self.version)
        return state

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
            raise ConfigError(f"run {cfg.run_id!r} already has policies in this Redis (latest "
                              f"v{self.store.latest()}); choose another --run-id, or --resume it from "
                              f"its run directory")
        self.store.set_run_meta(self.run_meta())
        self.logger = RunLogger(self.run_dir, to_dict(cfg), cfg.total_steps, self.console,
                                resume=resume_state["logger"] if resume_state else None)
        elapsed = resume_state["logger"]["elapsed"] if resume_state else 0.0
        self.start = time.perf_counter() - elapsed
        self._sps = self.env_steps / elapsed if elapsed > 0 else 0.0
        state = "failed"
        try:
            self.dispatcher.declare_queue()
            self.publish()
            self.save_checkpoint(force=True)
            self.heartbeat()
            self.train_loop()
            if cfg.eval.interval:
                if self._last_eval_version != self.version:
                    self.evaluate()  # the final policy always gets an evaluation
                self.drain_evaluations()
            self.save_checkpoint(force=True)
            result = self._finish(time.perf_counter() - self.start)
            state = "finished"
            return result
        finally:
            if state == "failed":
                self.retry.enabled = False  # Redis may be what failed: one attempt at the cleanup
            try:
                self.claim.check()  # the run is another trainer's now: leave its keys alone
                self.heartbeat(state)
                # Tasks still queued are skipped by workers; results still in flight are of no use now.
                self.dispatcher.finish()
            except Exception:  # noqa: BLE001 - Redis may be what failed; the run's own error matters
                pass
            self.logger.close()

    def train_loop(self) -> None:
        raise NotImplementedError

    def log_step(self, metrics: dict[str, float]) -> None:
        """One log step: console, CSV and TensorBoard, then the user's callback, which may stop the
        run (return False) or add metrics of its own (LogStep.extra, logged under custom/)."""
        self.logger.scalars(self.env_steps, metrics)
        if self.callback is None:
            return
        step = LogStep(self.env_steps, self.version, dict(metrics), self)
        if self.callback(step) is False:
            self._stop_requested = True
            self._log.info("run %s stopped by its callback after %d env steps", self.config.run_id,
                           self.env_steps)
        for key, value in step.extra.items():
            if self.logger.writer:
                self.logger.writer.add_scalar(f"custom/{key}", value, self.env_steps)

    def summary_extras(self) -> dict[str, Any]:
        """What a mode adds to summary.json."""
        return {}

    def _finish(self, wall: float) -> TrainResult:
        state = self.algo.state()
        blob = codec.encode_policy(state, {"version": str(self.version), "algo": self.config.algo,
                                           "run": self.config.run_id, "env": self.config.env.id,
                                           "policy": json.dumps(to_dict(self.config)["policy"])},
                                   self.file_secret)
        write_atomic(self.run_dir / "final_policy.safetensors", blob)
        best = self.run_dir / "best_policy.safetensors"
        stats = self.dispatcher.stats
        result = TrainResult(
            run_id=self.config.run_id, run_dir=self.run_dir, env_steps=self.env_steps,
            final_version=self.version, policy_sha256=codec.tensor_digest(state),
            rolling_return=self.logger.rolling_return, best_rolling_return=self.logger.best_rolling,
            eval_mean_return=self.eval_mean_return, best_eval_mean_return=self.best_eval_mean_return,
            wall_seconds=wall,
            redispatched=stats.redispatched, duplicates=stats.duplicates,
            dropped_stale=self.dropped_stale,
            task_ids_accepted=len(stats.accepted_task_ids),
            best_version=self.best_version, target_reached=self.target_reached(),
            final_policy=self.run_dir / "final_policy.safetensors",
            best_policy=best if self.best_version is not None and best.exists() else None)
        summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
        summary["target_reached_at"] = self._target_reached_at
        summary["receive_cpu_seconds"] = stats.receive_seconds
        summary["trainer_threads"] = self.threads  # torch threads the learner ran with (torch_threads)
        summary["dispatched"] = stats.dispatched
        summary["unique_task_ids_accepted"] = len(set(stats.accepted_task_ids))
        summary["faults"] = {"leases_expired": stats.leases_expired, "messages_lost": stats.messages_lost,
                             "time_limits": stats.time_limits, "stragglers": stats.stragglers,
                             "skipped_copies": stats.skipped, "state_restored": stats.state_restored,
                             "refused": stats.refused, "handed_back": stats.handed_back,
                             "redis_outages": self.retry.outages,
                             "redis_outage_seconds": round(self.retry.outage_seconds, 3)}
        summary["security"] = {k.split("/", 1)[1]: v for k, v in stats.security().items()}
        summary["accepted_task_ids"] = stats.accepted_task_ids
        summary.update(self.summary_extras())
        from rlfarm.config import json_safe  # strict JSON: no evaluation (NaN), best -inf -> null

        write_atomic(self.run_dir / "summary.json", json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")
        return result


class SyncTrainer(Trainer):
    iteration = 0  # iterations done; the next one's tasks get seeds from (seed, iteration, index)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        return tensors, {**state, "iteration": self.iteration}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self.iteration = state["iteration"]

    def collect_rollouts(self, iteration: int, progress: float) -> Rollout:
        cfg = self.config
        act = self.task_options(progress)
        specs = [TaskSpec(cfg.run_id, "rollout", iteration, i, self.version, cfg.seed,
                          steps=cfg.farm.steps_per_env, act=act) for i in range(cfg.farm.num_tasks)]
        results = self.dispatcher.gather_group(specs, on_other=self.handle_eval)
        return concat([Rollout.from_dict(r.rollout) for r in results])

    def train_loop(self) -> None:
        cfg = self.config
        for iteration in range(self.iteration, cfg.num_iterations):
            progress = iteration / cfg.num_iterations
            t0 = time.perf_counter()
            rollout = self.collect_rollouts(iteration, progress)
            collect_seconds = time.perf_counter() - t0
            self.env_steps += rollout.num_steps
            self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths,
                                 self.version)
            t1 = time.perf_counter()
            self.algo.observe(rollout, policy_lag=0)
            losses = dict.fromkeys(self.algo.loss_keys, math.nan)
            while self.algo.ready():
                losses = self.algo.update(progress)
            self.version += 1
            self.iteration = iteration + 1
            self.publish()
            self.save_checkpoint()
            self._sps = self.env_steps / (time.perf_counter() - self.start)
            farm = self.farm_scalars()
            ep = rollout.episode_returns
            self.log_step({
                "policy_version": self.version,
                "charts/SPS": self._sps,
                "charts/episodic_return": float(ep.mean()) if len(ep) else float("nan"),
                "charts/episodic_length": float(rollout.episode_lengths.mean()) if len(ep) else float("nan"),
                "charts/episodes": len(ep),
                "farm/collect_seconds": collect_seconds,
                "farm/update_seconds": time.perf_counter() - t1,
                "farm/policy_lag": 0,  # SYNC: every task acts with the version being trained
                **farm,
                **self.algo.scalars(progress),
                **losses,
            })
            self.heartbeat(farm=farm)
            self._on_event()
            if self._stop_requested:
                break
            self.maybe_evaluate()
            if self.target_reached():
                self._log.info("target return %g reached after %d env steps", cfg.target_return,
                               self.env_steps)
                break


def auto_policy_lag(tasks_in_flight: int, versions_per_result: float) -> int:
    """`async.max_policy_lag = "auto"`: the largest lag a result reaches without a fault.

    A task fetches the newest version when it starts; before its result is learned from, the other
    `tasks_in_flight - 1` results in flight and at most `tasks_in_flight` waiting in the backlog are,
    each publishing `versions_per_result` versions. So lag stays under 2 x tasks in flight results'
    worth of versions, and what is dropped is what a fault delayed (a straggler's backup, a task
    re-sent after a lost worker). A fixed bound fits one farm size only: cartpole-dqn's 48 fitted
    2 tasks in flight and dropped 19 % of the results with 3."""
    return max(1, math.ceil(2 * tasks_in_flight * versions_per_result))


class AsyncTrainer(Trainer):
    LOG_SECONDS = 1.0
    PUMP_SECONDS = 0.005  # during a long update, look for results and send tasks this often

    def __init__(self, *args: Any, tasks_in_flight: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.tasks_in_flight = cfg.async_.tasks_in_flight or tasks_in_flight or 2
        check_results_per_update(cfg, self.tasks_in_flight)
        self.algo.on_farm(self.tasks_in_flight)
        self.max_policy_lag = (cfg.async_.max_policy_lag
                               or auto_policy_lag(self.tasks_in_flight, self.algo.versions_per_result()))
        # Results received but not yet taken in by the learner. Bounded: while it is full, finished
        # tasks are not replaced, so a slow learner slows the farm down instead of piling results up.
        self.max_backlog = self.tasks_in_flight
        self._backlog: deque[Result] = deque()
        self._owed: deque[float] = deque()  # when each not-yet-replaced task finished (worker clock)
        self._slot_wait = 0.0  # task-slot seconds spent waiting for the trainer, this log interval
        self._slot_wait_total = 0.0
        self._last_pump = 0.0
        self.updates = 0  # algorithm updates; a version is published every algo.publish_every
        self._task_counter = 0
        self._lags: list[int] = []
        self._end_lags: list[int] = []
        self.results_refreshed = 0  # results whose task picked up a newer version while it ran
        self.results_unused = 0  # received after the run was over (discard_backlog)
        self.lag_counts: dict[int, int] = {}  # whole-run histogram of policy lag, consumed or dropped
        # NaN until learning starts, so every progress.csv row has the same columns.
        self._losses = dict.fromkeys(self.algo.loss_keys, math.nan)
        self._last_log = 0.0
        self._interval_start = time.perf_counter()

    @property
    def progress(self) -> float:
        return min(1.0, self.env_steps / self.config.total_steps)

    def dispatch_one(self) -> None:
        cfg = self.config
        self.dispatcher.submit(TaskSpec(cfg.run_id, "rollout", self._task_counter, 0, "latest", cfg.seed,
                                        steps=cfg.farm.steps_per_env, act=self.task_options(self.progress)))
        self._task_counter += 1
        if self._owed:  # this task takes the slot a finished one left: it waited this long
            waited = max(0.0, time.time() - self._owed.popleft())
            self._slot_wait += waited
            self._slot_wait_total += waited

    def refill(self) -> None:
        """Keep `tasks_in_flight` rollout tasks on the farm while the backlog has room."""
        running = sum(1 for key in self.dispatcher.pending if key[0] == "rollout")
        while self._owed and running < self.tasks_in_flight and len(self._backlog) < self.max_backlog:
            self.dispatch_one()
            running += 1

    def receive(self, timeout: float) -> None:
        """Take in what has arrived: evaluations at once, rollouts into the backlog (each leaves a
        slot to refill); then refill. Waits at most `timeout` seconds for something to arrive."""
        while len(self._backlog) < self.max_backlog:  # full: results wait in Redis, tasks are not replaced
            message = self.dispatcher.next_result(timeout=timeout)
            if message is None:
                break
            if message.kind == "eval":
                self.handle_eval(message)
            else:
                self._backlog.append(message)
                self._owed.append(message.finished or time.time())
            timeout = 0
        self.refill()

    def pump(self) -> None:
        """Called between the learner's steps: results keep being received and tasks sent."""
        now = time.perf_counter()
        if now - self._last_pump >= self.PUMP_SECONDS:
            self._last_pump = now
            self.receive(timeout=0)

    def train_loop(self) -> None:
        cfg = self.config
        for _ in range(self.tasks_in_flight):
            self.dispatch_one()
        while self.env_steps < cfg.total_steps:
            if not self._backlog:
                self.receive(timeout=1.0)
            if self._backlog:
                self.consume(self._backlog.popleft())
                self.refill()
                self.maybe_evaluate()
            if time.perf_counter() - self._last_log >= self.LOG_SECONDS:
                self.log()
                if self._stop_requested:
                    break
            if self.target_reached():
                self._log.info("target return %g reached after %d env steps", cfg.target_return,
                               self.env_steps)
                break
        self.discard_backlog()
        self.log()

    def discard_backlog(self) -> None:
        """Results received while the last ones were learned from, once the run is over: never
        learned from, so they are not counted as accepted either (summary: results_unused), and
        every accepted result's steps are in env_steps. A slow learner leaves more of them."""
        while self._backlog:
            self.dispatcher.unaccept(self._backlog.popleft())
            self.results_unused += 1

    def consume(self, message: Result) -> None:
        """Lag accounting, then the algorithm takes the result in and runs what updates it is ready for."""
        cfg = self.config
        lag = self.version - message.version
        self._lags.append(lag)
        # With async.refresh_steps a task may end acting with a newer version than it started with:
        # lag is counted from the oldest (what max_policy_lag bounds), this from the newest.
        last = message.last_version if message.last_version is not None else message.version
        self._end_lags.append(self.version - last)
        self.results_refreshed += last != message.version
        self.lag_counts[lag] = self.lag_counts.get(lag, 0) + 1
        if lag > self.max_policy_lag:
            self.dropped_stale += 1
            return
        rollout = Rollout.from_dict(message.rollout)
        self.env_steps += rollout.num_steps
        self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths,
                             message.version)
        self.algo.observe(rollout, policy_lag=lag)
        while self.algo.ready():
            self._losses = self.algo.update(self.progress, between=self.pump)
            self.updates += 1
            if self.updates % self.algo.publish_every == 0:
                self.version += 1
                self.publish()
                self.save_checkpoint()
            self.pump()
        self._sps = self.env_steps / (time.perf_counter() - self.start)

    def slots_waiting(self) -> float:
        """The fraction of the farm's task-slot time, over the last log interval, spent waiting for
        the trainer (a task finished, its replacement not yet sent)."""
        elapsed = time.perf_counter() - self._interval_start
        return min(1.0, self._slot_wait / (self.tasks_in_flight * elapsed)) if elapsed > 0 else 0.0

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        return tensors, {**state, "task_counter": self._task_counter, "updates": self.updates,
                         "dropped_stale": self.dropped_stale, "results_refreshed": self.results_refreshed,
                         "lag_counts": {str(k): v for k, v in self.lag_counts.items()}}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self._task_counter = state["task_counter"] + self.RESUME_TASK_OFFSET
        self.updates, self.dropped_stale = state["updates"], state["dropped_stale"]
        self.results_refreshed = state.get("results_refreshed", 0)  # (checkpoints before it: 0)
        self.lag_counts = {int(k): v for k, v in state["lag_counts"].items()}

    def summary_extras(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.start
        return {"policy_lag_histogram": {str(k): v for k, v in sorted(self.lag_counts.items())},
                "results_refreshed": self.results_refreshed, "results_unused": self.results_unused,
                "max_policy_lag": self.max_policy_lag,
                "slots_waiting": round(self._slot_wait_total / (self.tasks_in_flight * elapsed), 4)
                if elapsed > 0 else 0.0}

    def log(self) -> None:
        self._last_log = time.perf_counter()
        lags = np.asarray(self._lags or [0])
        farm = {**self.farm_scalars(), "farm/slots_waiting": self.slots_waiting(), "farm/backlog": len(self._backlog)}
        self.log_step({
            "policy_version": self.version,
            "charts/SPS": self._sps,
            **self.algo.scalars(self.progress),
            "farm/policy_lag": float(lags.mean()),
            "farm/policy_lag_min": int(lags.min()),
            "farm/policy_lag_max": int(lags.max()),
            "farm/policy_lag_end": float(np.mean(self._end_lags or [0])),
            "farm/results_dropped_stale": self.dropped_stale,
            **farm,
            "eval/mean_return": self.eval_mean_return,
            **self._losses,
        })
        self._slot_wait, self._interval_start = 0.0, time.perf_counter()
        if self._lags:
            self.logger.histogram("farm/policy_lag_distribution", lags, self.env_steps)
        self._lags, self._end_lags = [], []
        self.heartbeat(farm=farm)
        self._on_event()


def make_trainer(config: RunConfig, redis_url: str, run_dir: Path, **kwargs: Any) -> Trainer:
    """The trainer of the run's mode (the algorithm is the config's; rlfarm.algos checks it can run so)."""
    cls = AsyncTrainer if config.mode == "async" else SyncTrainer
    if cls is SyncTrainer:
        kwargs.pop("tasks_in_flight", None)
    return cls(config, redis_url, run_dir, **kwargs)
