"""The trainer loop: publish -> dispatch -> gather -> update -> log, one iteration at a time.

SYNC (on-policy): each iteration sends `farm.num_tasks` rollout tasks that all act with version v,
waits for the whole group, assembles it in task-index order, updates, and publishes v + 1. Because
tasks are deterministic and the group is ordered by index, what is learned does not depend on how
many workers there are or which finishes first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from rlfarm import codec
from rlfarm.algos import check_mode
from rlfarm.algos.ppo import PPO
from rlfarm.celery_app import make_app
from rlfarm.config import ConfigError, RunConfig, to_dict
from rlfarm.dispatch import Dispatcher
from rlfarm.envs import describe
from rlfarm.metrics import RunLogger
from rlfarm.policy import build_policy
from rlfarm.rollout import Rollout, concat
from rlfarm.store import PolicyStore, connect


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
    wall_seconds: float
    redispatched: int
    duplicates: int


class SyncTrainer:
    def __init__(self, config: RunConfig, redis_url: str, run_dir: Path,
                 console: Console | None = None):
        check_mode(config.algo, config.mode)
        self.config = config
        self.run_dir = Path(run_dir)
        self.console = console or Console()
        self.device = resolve_device(config.device)
        self.space = describe(config.env.id)
        self.client = connect(redis_url)
        self.store = PolicyStore(self.client, config.run_id, keep=config.farm.keep_versions)
        self.app = make_app(redis_url)

        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        policy = build_policy(self.space, config.policy)
        self.algo = PPO(policy, config.ppo, config.seed, self.device)
        self.logger: RunLogger | None = None
        self.dispatcher = Dispatcher(self.app, self.client, config.run_id, config.farm.task_timeout,
                                     config.farm.max_redispatch, on_event=self._on_event)
        self.env_steps = 0
        self.version = 0
        self._sps = 0.0

    def _on_event(self) -> None:
        if self.logger:
            self.logger.status(self.env_steps, self._sps, self.version, self.dispatcher.in_flight)

    def publish(self) -> None:
        self.store.publish(self.version, self.algo.state(), self.config.algo,
                           {"env_steps": str(self.env_steps)})

    def collect_rollouts(self, iteration: int) -> Rollout:
        cfg = self.config
        specs = [{"iteration": iteration, "index": i, "version": self.version,
                  "steps": cfg.farm.steps_per_env, "seed": cfg.seed} for i in range(cfg.farm.num_tasks)]
        results = self.dispatcher.gather_group(specs)
        return concat([Rollout.from_dict(r["rollout"]) for r in results])

    def train(self) -> TrainResult:
        cfg = self.config
        self.store.set_run_meta({"config": to_dict(cfg), "space": self.space.to_dict()})
        self.logger = RunLogger(self.run_dir, to_dict(cfg), cfg.total_steps, self.console)
        start = time.perf_counter()
        try:
            self.publish()
            for iteration in range(cfg.num_iterations):
                t0 = time.perf_counter()
                rollout = self.collect_rollouts(iteration)
                collect_seconds = time.perf_counter() - t0
                self.env_steps += rollout.num_steps
                self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths,
                                     self.version)
                t1 = time.perf_counter()
                losses = self.algo.train(rollout, progress_remaining=1.0 - iteration / cfg.num_iterations)
                self.version += 1
                self.publish()
                self._sps = self.env_steps / (time.perf_counter() - start)
                ep = rollout.episode_returns
                self.logger.scalars(self.env_steps, {
                    "policy_version": self.version,
                    "charts/SPS": self._sps,
                    "charts/episodic_return": float(ep.mean()) if len(ep) else float("nan"),
                    "charts/episodic_length": float(rollout.episode_lengths.mean()) if len(ep) else float("nan"),
                    "charts/episodes": len(ep),
                    "farm/collect_seconds": collect_seconds,
                    "farm/update_seconds": time.perf_counter() - t1,
                    "farm/redispatched": self.dispatcher.stats.redispatched,
                    "farm/results_dropped": self.dispatcher.stats.duplicates,
                    **losses,
                })
                self._on_event()
                if self.logger.rolling_return >= cfg.target_return:
                    self.console.print(f"target return {cfg.target_return:g} reached after "
                                       f"{self.env_steps} env steps", highlight=False)
                    break
            return self._finish(time.perf_counter() - start)
        finally:
            self.logger.close()

    def _finish(self, wall: float) -> TrainResult:
        state = self.algo.state()
        blob = codec.encode_policy(state, {"version": str(self.version), "algo": self.config.algo,
                                           "run": self.config.run_id, "env": self.config.env.id,
                                           "policy": json.dumps(to_dict(self.config)["policy"])})
        (self.run_dir / "final_policy.safetensors").write_bytes(blob)
        result = TrainResult(
            run_id=self.config.run_id, run_dir=self.run_dir, env_steps=self.env_steps,
            final_version=self.version, policy_sha256=codec.tensor_digest(state),
            rolling_return=self.logger.rolling_return, best_rolling_return=self.logger.best_rolling,
            wall_seconds=wall, redispatched=self.dispatcher.stats.redispatched,
            duplicates=self.dispatcher.stats.duplicates)
        summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
        summary["receive_cpu_seconds"] = self.dispatcher.stats.receive_seconds
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return result
