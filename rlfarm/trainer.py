"""The trainer loops: publish -> dispatch -> gather -> update -> log.

SYNC (on-policy, `SyncTrainer`): each iteration sends `farm.num_tasks` rollout tasks that all act
with version v, waits for the whole group, assembles it in task-index order, updates, and publishes
v + 1. Tasks are deterministic and the group is ordered by index, so what is learned does not depend
on how many workers there are or which finishes first.

ASYNC (off-policy, `AsyncTrainer`): K tasks stay in flight, each acting with the newest version at
the moment it starts. Results are consumed in completion order; a replacement is sent at once; the
learner runs `replay_ratio` gradient steps per consumed env step and publishes a new version every
`publish_interval` gradient steps. Policy lag (trainer version - acting version) is recorded, and
results older than `max_policy_lag` versions are dropped and counted.

Both send greedy evaluation tasks every `eval.interval` env steps, off the training path.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from rlfarm import checkpoint, codec
from rlfarm.algos import check_mode
from rlfarm.algos.dqn import DQN
from rlfarm.algos.ppo import PPO
from rlfarm.celery_app import make_app
from rlfarm.config import ConfigError, RunConfig, to_dict
from rlfarm.dispatch import Dispatcher
from rlfarm.envs import describe
from rlfarm.metrics import RunLogger
from rlfarm.policy import build_network
from rlfarm.replay import PrioritizedReplayBuffer, ReplayBuffer, nstep_transitions
from rlfarm.rollout import Rollout, concat
from rlfarm.outage import OutageRetry, resilient_client
from rlfarm.store import PolicyStore, connect, queue_depth, redact, write_status


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
    best_eval_mean_return: float
    wall_seconds: float
    redispatched: int
    duplicates: int
    dropped_stale: int = 0
    task_ids_accepted: int = 0


@dataclass
class _Evaluation:
    env_steps: int
    version: int
    tasks: int
    returns: list[float] = field(default_factory=list)
    done: int = 0


class Trainer:
    """What both modes share: store, farm client, network, metrics, evaluation, the final save."""

    # Tasks sent by a trainer before it died may still run and report under task numbers after the
    # checkpoint's; a resumed trainer numbers its ASYNC and evaluation tasks from far beyond them.
    RESUME_TASK_OFFSET = 1_000_000

    def __init__(self, config: RunConfig, redis_url: str, run_dir: Path, console: Console | None = None,
                 resume: bool = False):
        """`resume`: continue the run in `run_dir` from its trainer checkpoint (see rlfarm.checkpoint)."""
        check_mode(config.algo, config.mode)
        self.resume = resume
        self.config = config
        self.run_dir = Path(run_dir)
        self.console = console or Console()
        self._stderr = Console(stderr=True)
        self.device = resolve_device(config.device)
        self.space = describe(config.env.id)
        connect(redis_url).close()  # fails fast and clearly when Redis is not there at the start
        # From here on, every Redis command waits out an outage of up to farm.redis_outage_timeout.
        self.retry = OutageRetry(config.farm.redis_outage_timeout, where=f"Redis at {redact(redis_url)}",
                                 notify=self.warn)
        self.client = resilient_client(redis_url, self.retry)
        self.store = PolicyStore(self.client, config.run_id, keep=config.farm.keep_versions)
        self.app = make_app(redis_url)
        self._log = logging.getLogger("rlfarm.trainer")
        self._log_file: logging.Handler | None = None

        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        network = build_network(config.algo, self.space, config.policy)
        if config.algo == "dqn":
            self.algo: Any = DQN(network, config.dqn, config.seed, self.device)
        else:
            self.algo = PPO(network, config.ppo, config.seed, self.device)
        self.logger: RunLogger | None = None
        farm = config.farm
        self.dispatcher = Dispatcher(self.app, self.client, config.run_id, farm.task_timeout,
                                     farm.max_redispatch, on_event=self._on_event,
                                     env=config.env.id,  # shown in Flower's task labels
                                     lease_seconds=farm.lease_seconds, time_limit=farm.task_time_limit,
                                     retry=self.retry, on_state_lost=self.restore_run_state,
                                     notify=self.warn)
        self.env_steps = 0
        self.version = 0
        self.start = 0.0
        self.wall_start = time.time()
        self._sps = 0.0
        self._evals: dict[int, _Evaluation] = {}
        self._eval_counter = 0  # evaluation numbers (task keys) are never reused, across resumes too
        self._last_checkpoint = -math.inf
        self._next_eval = config.eval.interval
        self.eval_mean_return = math.nan
        self.best_eval_mean_return = -math.inf

    # ---- shared pieces ---------------------------------------------------------------------------
    def warn(self, text: str) -> None:
        """A fault the run rides out: one line on the console and in the run's trainer.log."""
        self._stderr.print(f"[yellow]rlfarm: warning:[/] {text}", highlight=False, soft_wrap=True)
        self._log.warning(text)

    def restore_run_state(self) -> None:
        """The run's metadata vanished from Redis (FLUSHALL, a restart without its data): write back
        what the trainer owns, so workers can go on building the env and fetching the policy."""
        self.warn(f"run {self.config.run_id}'s state is gone from Redis (flushed, or restarted without "
                  f"its data): writing back its metadata and policy v{self.version}, re-sending lost tasks")
        self.store.set_run_meta({"config": to_dict(self.config), "space": self.space.to_dict()})
        latest = self.store.latest()
        if latest is None or latest < self.version:
            self.publish()
        self.heartbeat()

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
                "farm/redis_outages": self.retry.outages}

    def heartbeat(self, state: str = "running", farm: dict[str, float] | None = None) -> None:
        """Refresh `rlfarm:<run>:status` (expires by itself when the trainer is gone)."""
        cfg = self.config
        farm = farm if farm is not None else self.farm_scalars()
        write_status(self.client, cfg.run_id, {
            "state": state, "mode": cfg.mode, "algo": cfg.algo, "env": cfg.env.id,
            "env_steps": self.env_steps, "total_steps": cfg.total_steps, "version": self.version,
            "sps": f"{self._sps:.1f}", "tasks_in_flight": int(farm["farm/tasks_in_flight"]),
            "eval_mean_return": f"{self.eval_mean_return:.2f}", "host": socket.gethostname(),
            "pid": os.getpid(), "started": f"{self.wall_start:.3f}", "updated": f"{time.time():.3f}"})

    def publish(self) -> None:
        self.store.publish(self.version, self.algo.state(), self.config.algo,
                           {"env_steps": str(self.env_steps)})

    def evaluate(self) -> None:
        """Send greedy evaluation tasks acting with the latest version when they start (so a busy
        farm can never ask for a version already trimmed); results are logged on arrival."""
        cfg = self.config.eval
        number = self._eval_counter
        self._eval_counter += 1
        per_task = math.ceil(cfg.episodes / cfg.tasks)
        self._evals[number] = _Evaluation(self.env_steps, self.version, cfg.tasks)
        for index in range(cfg.tasks):
            self.dispatcher.submit({"kind": "eval", "iteration": number, "index": index,
                                    "version": "latest", "episodes": per_task,
                                    "seed": self.config.seed + 1_000_003})

    def maybe_evaluate(self) -> None:
        interval = self.config.eval.interval
        if interval and self.env_steps >= self._next_eval:
            self.evaluate()
            while self._next_eval <= self.env_steps:
                self._next_eval += interval

    def handle_eval(self, message: dict[str, Any]) -> None:
        ev = self._evals[message["iteration"]]
        ev.version = min(ev.version, message["version"]) if ev.done else message["version"]
        ev.returns += [float(r) for r in message["returns"]]
        ev.done += 1
        if ev.done == ev.tasks:
            self.eval_mean_return = float(np.mean(ev.returns))
            self.best_eval_mean_return = max(self.best_eval_mean_return, self.eval_mean_return)
            self.logger.evaluation(ev.env_steps, ev.returns, ev.version)

    def drain_evaluations(self) -> None:
        """Wait for evaluation tasks still in flight so the run's last evaluation is recorded."""
        while any(k[0] == "eval" for k in self.dispatcher.pending):
            message = self.dispatcher.next_result(timeout=1.0)
            if message is not None and message["kind"] == "eval":
                self.handle_eval(message)

    def target_reached(self) -> bool:
        """Against the latest greedy evaluation when evaluations run, else the rolling training return."""
        score = self.eval_mean_return if self.config.eval.interval else self.logger.rolling_return
        return score >= self.config.target_return

    # ---- checkpoints (rlfarm train --resume) ------------------------------------------------------
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, algo_state = self.algo.checkpoint()
        tensors["rng.torch"] = torch.get_rng_state()
        stats = self.dispatcher.stats
        return tensors, {
            "run_id": self.config.run_id, "env_steps": self.env_steps, "version": self.version,
            "next_eval": self._next_eval, "eval_counter": self._eval_counter,
            "eval_mean_return": self.eval_mean_return, "best_eval_mean_return": self.best_eval_mean_return,
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
        self.console.print(f"resuming run {self.config.run_id} from its checkpoint: {self.env_steps} env "
                           f"steps, policy v{self.version}", highlight=False)
        return state

    def train(self) -> TrainResult:
        cfg = self.config
        resume_state = self._resume() if self.resume else None
        if resume_state is None and self.store.latest() is not None:
            raise ConfigError(f"run {cfg.run_id!r} already has policies in this Redis (latest "
                              f"v{self.store.latest()}); choose another --run-id, or --resume it from "
                              f"its run directory")
        self.store.set_run_meta({"config": to_dict(cfg), "space": self.space.to_dict()})
        self.logger = RunLogger(self.run_dir, to_dict(cfg), cfg.total_steps, self.console,
                                resume=resume_state["logger"] if resume_state else None)
        elapsed = resume_state["logger"]["elapsed"] if resume_state else 0.0
        self.start = time.perf_counter() - elapsed
        self._sps = self.env_steps / elapsed if elapsed > 0 else 0.0
        self._log_file = logging.FileHandler(self.run_dir / "trainer.log")
        self._log_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self._log.addHandler(self._log_file)
        state = "failed"
        try:
            self.dispatcher.declare_queue()
            self.publish()
            self.save_checkpoint(force=True)
            self.heartbeat()
            self.train_loop()
            if cfg.eval.interval:
                if not self._evals or self._evals[self._eval_counter - 1].version != self.version:
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
                self.heartbeat(state)
                # Tasks still queued are skipped by workers; results still in flight are of no use now.
                self.dispatcher.finish()
            except Exception:  # noqa: BLE001 - Redis may be what failed; the run's own error matters
                pass
            self.logger.close()
            self._log.removeHandler(self._log_file)
            self._log_file.close()

    def train_loop(self) -> None:
        raise NotImplementedError

    def _finish(self, wall: float) -> TrainResult:
        state = self.algo.state()
        blob = codec.encode_policy(state, {"version": str(self.version), "algo": self.config.algo,
                                           "run": self.config.run_id, "env": self.config.env.id,
                                           "policy": json.dumps(to_dict(self.config)["policy"])},
                                   self.store.secret)
        (self.run_dir / "final_policy.safetensors").write_bytes(blob)
        stats = self.dispatcher.stats
        result = TrainResult(
            run_id=self.config.run_id, run_dir=self.run_dir, env_steps=self.env_steps,
            final_version=self.version, policy_sha256=codec.tensor_digest(state),
            rolling_return=self.logger.rolling_return, best_rolling_return=self.logger.best_rolling,
            eval_mean_return=self.eval_mean_return, best_eval_mean_return=self.best_eval_mean_return,
            wall_seconds=wall,
            redispatched=stats.redispatched, duplicates=stats.duplicates,
            dropped_stale=getattr(self, "dropped_stale", 0),
            task_ids_accepted=len(stats.accepted_task_ids))
        summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
        summary["receive_cpu_seconds"] = stats.receive_seconds
        summary["dispatched"] = stats.dispatched
        summary["unique_task_ids_accepted"] = len(set(stats.accepted_task_ids))
        summary["faults"] = {"leases_expired": stats.leases_expired, "messages_lost": stats.messages_lost,
                             "time_limits": stats.time_limits, "stragglers": stats.stragglers,
                             "skipped_copies": stats.skipped, "state_restored": stats.state_restored,
                             "redis_outages": self.retry.outages,
                             "redis_outage_seconds": round(self.retry.outage_seconds, 3)}
        summary["accepted_task_ids"] = stats.accepted_task_ids
        if hasattr(self, "lag_counts"):
            summary["policy_lag_histogram"] = {str(k): v for k, v in sorted(self.lag_counts.items())}
        from rlfarm.config import json_safe  # strict JSON: no evaluation (NaN), best -inf -> null

        (self.run_dir / "summary.json").write_text(
            json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")
        return result


class SyncTrainer(Trainer):
    iteration = 0  # iterations done; the next one's tasks get seeds from (seed, iteration, index)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        return tensors, {**state, "iteration": self.iteration}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self.iteration = state["iteration"]

    def collect_rollouts(self, iteration: int) -> Rollout:
        cfg = self.config
        specs = [{"iteration": iteration, "index": i, "version": self.version,
                  "steps": cfg.farm.steps_per_env, "seed": cfg.seed} for i in range(cfg.farm.num_tasks)]
        results = self.dispatcher.gather_group(specs, on_other=self.handle_eval)
        return concat([Rollout.from_dict(r["rollout"]) for r in results])

    def train_loop(self) -> None:
        cfg = self.config
        for iteration in range(self.iteration, cfg.num_iterations):
            t0 = time.perf_counter()
            rollout = self.collect_rollouts(iteration)
            collect_seconds = time.perf_counter() - t0
            self.env_steps += rollout.num_steps
            self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths,
                                 self.version)
            t1 = time.perf_counter()
            losses = self.algo.train(rollout, progress_remaining=1.0 - iteration / cfg.num_iterations)
            self.version += 1
            self.iteration = iteration + 1
            self.publish()
            self.save_checkpoint()
            self._sps = self.env_steps / (time.perf_counter() - self.start)
            farm = self.farm_scalars()
            ep = rollout.episode_returns
            self.logger.scalars(self.env_steps, {
                "policy_version": self.version,
                "charts/SPS": self._sps,
                "charts/episodic_return": float(ep.mean()) if len(ep) else float("nan"),
                "charts/episodic_length": float(rollout.episode_lengths.mean()) if len(ep) else float("nan"),
                "charts/episodes": len(ep),
                "farm/collect_seconds": collect_seconds,
                "farm/update_seconds": time.perf_counter() - t1,
                "farm/policy_lag": 0,  # SYNC: every task acts with the version being trained
                **farm,
                **losses,
            })
            self.heartbeat(farm=farm)
            self._on_event()
            self.maybe_evaluate()
            if self.target_reached():
                self.console.print(f"target return {cfg.target_return:g} reached after "
                                   f"{self.env_steps} env steps", highlight=False)
                break


class AsyncTrainer(Trainer):
    LOG_SECONDS = 1.0

    def __init__(self, *args: Any, tasks_in_flight: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        buffer_cls = PrioritizedReplayBuffer if cfg.dqn.prioritized else ReplayBuffer
        extra = {"alpha": cfg.dqn.per_alpha, "eps": cfg.dqn.per_eps} if cfg.dqn.prioritized else {}
        self.replay = buffer_cls(cfg.dqn.buffer_size, self.space.obs_dim, seed=cfg.seed, **extra)
        self.tasks_in_flight = cfg.async_.tasks_in_flight or tasks_in_flight or 2
        self.dropped_stale = 0
        self._task_counter = 0
        self._grad_budget = 0.0
        self._lags: list[int] = []
        self.lag_counts: dict[int, int] = {}  # whole-run histogram of policy lag, consumed or dropped
        # NaN until learning starts, so every progress.csv row has the same columns.
        self._losses = dict.fromkeys(("losses/td_loss", "losses/q_values", "losses/grad_norm",
                                      "charts/learning_rate"), math.nan)
        self._last_log = 0.0

    def epsilon(self) -> float:
        if self.env_steps < self.config.dqn.learning_starts:
            return 1.0  # heatup: uniform random actions
        return self.algo.epsilon(self.env_steps / self.config.total_steps)

    def dispatch_one(self) -> None:
        cfg = self.config
        self.dispatcher.submit({"iteration": self._task_counter, "index": 0, "version": "latest",
                                "steps": cfg.farm.steps_per_env, "seed": cfg.seed,
                                "epsilon": self.epsilon()})
        self._task_counter += 1

    def train_loop(self) -> None:
        cfg = self.config
        for _ in range(self.tasks_in_flight):
            self.dispatch_one()
        while self.env_steps < cfg.total_steps:
            message = self.dispatcher.next_result(timeout=1.0)
            if message is not None:
                if message["kind"] == "eval":
                    self.handle_eval(message)
                else:
                    self.dispatch_one()  # keep the workers busy before spending time learning
                    self.consume(message)
                    self.maybe_evaluate()
            if time.perf_counter() - self._last_log >= self.LOG_SECONDS:
                self.log()
            if self.target_reached():
                self.console.print(f"target return {cfg.target_return:g} reached after "
                                   f"{self.env_steps} env steps", highlight=False)
                break
        self.log()

    def consume(self, message: dict[str, Any]) -> None:
        cfg = self.config
        lag = self.version - message["version"]
        self._lags.append(lag)
        self.lag_counts[lag] = self.lag_counts.get(lag, 0) + 1
        if lag > cfg.async_.max_policy_lag:
            self.dropped_stale += 1
            return
        rollout = Rollout.from_dict(message["rollout"])
        self.env_steps += rollout.num_steps
        self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths,
                             message["version"])
        self.replay.add(nstep_transitions(rollout, cfg.dqn.n_step, cfg.dqn.gamma))
        if self.env_steps < cfg.dqn.learning_starts:
            return
        self._grad_budget += rollout.num_steps * cfg.dqn.replay_ratio
        progress = min(1.0, self.env_steps / cfg.total_steps)
        beta = cfg.dqn.per_beta + (1.0 - cfg.dqn.per_beta) * progress
        while self._grad_budget >= 1.0:
            batch = self.replay.sample(cfg.dqn.batch_size, beta=beta)
            self._losses, td_errors = self.algo.train_step(batch, progress)
            self.replay.update_priorities(batch.indices, td_errors)
            self._grad_budget -= 1.0
            if self.algo.gradient_steps % cfg.async_.publish_interval == 0:
                self.version += 1
                self.publish()
                self.save_checkpoint()
        self._sps = self.env_steps / (time.perf_counter() - self.start)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        replay_meta = None
        if self.config.checkpoint_replay:
            arrays, replay_meta = self.replay.state()
            tensors.update({f"replay.{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})
        return tensors, {**state, "task_counter": self._task_counter, "grad_budget": self._grad_budget,
                         "dropped_stale": self.dropped_stale, "replay": replay_meta,
                         "lag_counts": {str(k): v for k, v in self.lag_counts.items()}}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self._task_counter = state["task_counter"] + self.RESUME_TASK_OFFSET
        self._grad_budget, self.dropped_stale = state["grad_budget"], state["dropped_stale"]
        self.lag_counts = {int(k): v for k, v in state["lag_counts"].items()}
        if state["replay"] is not None:
            arrays = {k[len("replay."):]: v.numpy() for k, v in tensors.items() if k.startswith("replay.")}
            self.replay.restore(arrays, state["replay"])
        # else: the replay buffer was not saved (checkpoint_replay = false); it refills from new results.

    def log(self) -> None:
        self._last_log = time.perf_counter()
        lags = np.asarray(self._lags or [0])
        farm = self.farm_scalars()
        self.logger.scalars(self.env_steps, {
            "policy_version": self.version,
            "charts/SPS": self._sps,
            "charts/epsilon": self.epsilon(),
            "charts/gradient_steps": self.algo.gradient_steps,
            "farm/policy_lag": float(lags.mean()),
            "farm/policy_lag_min": int(lags.min()),
            "farm/policy_lag_max": int(lags.max()),
            "farm/results_dropped_stale": self.dropped_stale,
            **farm,
            "farm/replay_size": len(self.replay),
            "eval/mean_return": self.eval_mean_return,
            **self._losses,
        })
        if self._lags:
            self.logger.histogram("farm/policy_lag_distribution", lags, self.env_steps)
        self._lags = []
        self.heartbeat(farm=farm)
        self._on_event()


def make_trainer(config: RunConfig, redis_url: str, run_dir: Path, **kwargs: Any) -> Trainer:
    cls = AsyncTrainer if config.mode == "async" else SyncTrainer
    if cls is SyncTrainer:
        kwargs.pop("tasks_in_flight", None)
    return cls(config, redis_url, run_dir, **kwargs)
