"""The SYNC loop (`SyncTrainer`): each iteration sends `farm.num_tasks` rollout tasks that all act
with version v, waits for the whole group, assembles it in task-index order, updates, and publishes
v + 1; the last one runs fewer steps when total_steps is not a whole number of iterations. Tasks
are deterministic and the group is ordered by index, so what is learned does not depend
on how many workers there are or which finishes first. See docs/architecture.md (1. Data flow).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from rlfarm.core.protocol import TaskSpec
from rlfarm.core.rollout import Rollout, concat
from rlfarm.trainer.base import Trainer
from rlfarm.trainer.log import log


class SyncTrainer(Trainer):
    iteration = 0  # iterations done; the next one's tasks get seeds from (seed, iteration, index)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.streams.open(self.config.farm.num_tasks)  # "continue": task i always continues stream i

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        return tensors, {**state, "iteration": self.iteration}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self.iteration = state["iteration"]

    def collect_rollouts(self, iteration: int, progress: float, steps: int | None = None) -> Rollout:
        """The iteration's group of tasks, `steps` per env each (default farm.steps_per_env)."""
        cfg = self.config
        act = self.task_options(progress)
        specs = [
            TaskSpec(
                cfg.run_id,
                "rollout",
                iteration,
                i,
                self.version,
                cfg.seed,
                steps=steps or cfg.farm.steps_per_env,
                act=self.rollout_options(act, iteration, i),
                stream=self.streams.ref(i),
                lines=self.store.lines_of(self.version),
            )
            for i in range(cfg.farm.num_tasks)
        ]
        results = self.channel.gather_group(specs)  # evaluations arriving meanwhile: handle_eval
        for i, result in enumerate(results):
            self.streams.advance(result, i)
            self.took_result(result)
        return concat([Rollout.from_dict(r.rollout) for r in results])

    def train_loop(self) -> None:
        cfg = self.config
        # Until total_steps, the last iteration shorter if need be (cfg.task_steps); progress is the
        # same as iterations done / iterations when they are whole.
        while self.env_steps < cfg.total_steps:
            iteration = self.iteration
            progress = self.env_steps / cfg.total_steps
            t0 = time.perf_counter()
            rollout = self.collect_rollouts(iteration, progress, cfg.task_steps(self.env_steps))
            collect_seconds = time.perf_counter() - t0
            self.env_steps += rollout.num_steps
            self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths, self.version)
            t1 = time.perf_counter()
            self.algo.observe(rollout, policy_lag=0)
            losses = dict.fromkeys(self.algo.loss_keys, math.nan)
            while self.algo.ready():
                losses = self.algo.update(progress)
            self.version += 1
            self.iteration = iteration + 1
            self.publish()
            self._sps = self.env_steps / (time.perf_counter() - self.start)
            farm = self.heartbeats.scalars()
            ep = rollout.episode_returns
            self.log_step(
                {
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
                }
            )
            # After the row: a kill between the two leaves a row the resumed run drops and writes
            # again, never a checkpoint past a row that was not written.
            self.save_checkpoint()
            self.heartbeat(farm=farm)
            self.on_event()
            if self._stop_requested:
                break
            self.maybe_evaluate()
            if self.target_reached():
                log.info("target return %g reached after %d env steps", cfg.target_return, self.env_steps)
                break
