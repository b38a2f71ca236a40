"""The ASYNC loop (`AsyncTrainer`): K tasks stay in flight, each acting with the newest version at the
moment it starts. Results are consumed in completion order; a replacement is sent at once; the
algorithm takes each result in and runs the updates it is ready for, and a new version is published
every `publish_every` updates. Policy lag (trainer version - acting version) is recorded, and results
older than `max_policy_lag` versions (`auto_policy_lag` for "auto") are dropped and counted. See
docs/architecture.md (1. Data flow).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from rlfarm.core.protocol import Result, TaskSpec
from rlfarm.core.rollout import Rollout
from rlfarm.trainer.base import Trainer
from rlfarm.trainer.log import log
from rlfarm.trainer.pace import InFlightPace
from rlfarm.trainer.policy_lag import LagBook, SlotWait, auto_policy_lag, line_lags, stale_result


class AsyncTrainer(Trainer):
    LOG_SECONDS = 1.0
    PUMP_SECONDS = 0.005  # during a long update, look for results and send tasks this often

    def __init__(self, *args: Any, tasks_in_flight: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.tasks_in_flight = cfg.async_.tasks_in_flight or tasks_in_flight or 2
        self.algo.on_farm(self.tasks_in_flight)
        self.max_policy_lag = cfg.async_.max_policy_lag or auto_policy_lag(
            self.tasks_in_flight, self.algo.versions_per_result()
        )
        # "auto": tasks in flight sized by the learner's pace (rlfarm.trainer.pace), the farm's
        # worker processes at most; a number given in the config is kept as given.
        self.pace = InFlightPace(self.tasks_in_flight) if not cfg.async_.tasks_in_flight else None
        self.window = self.tasks_in_flight  # tasks kept in flight now
        # Results received but not yet taken in by the learner. Bounded: while it is full, finished
        # tasks are not replaced, so a slow learner slows the farm down instead of piling results up.
        # It holds a whole batch at least: while the learner spends an update on K results, the farm
        # acts the next K (one window of tasks at a time) instead of stopping after one window.
        self.batch_results = self.algo.batch_results()
        self.max_backlog = max(self.window, self.batch_results)
        self._paced_results, self._paced_task_seconds, self._waited = 0, 0.0, 0.0  # this log interval
        self._backlog: deque[Result] = deque()
        self._owed: deque[float] = deque()  # when each not-yet-replaced task finished (worker clock)
        self.slot_wait = SlotWait()
        self._last_pump = 0.0
        self.updates = 0  # algorithm updates; a version is published every algo.publish_every
        self._task_counter = 0
        # "continue": one env stream per task slot; a finished task's stream goes to its replacement.
        self.streams.open(self.tasks_in_flight)
        self._free_streams: deque[int] = deque(range(self.tasks_in_flight))
        self._task_streams: dict[int, int] = {}  # task number -> its stream
        self.lags = LagBook()
        self.results_refreshed = 0  # results whose task picked up a newer version while it ran
        self.results_unused = 0  # received after the run was over (discard_backlog)
        # NaN until learning starts, so every progress.csv row has the same columns.
        self._losses = dict.fromkeys(self.algo.loss_keys, math.nan)
        self._last_log = 0.0
        self._interval_start = time.perf_counter()
        # Seconds of the log interval the learner computed (its updates, less the receiving done from
        # inside them), for farm/learner_busy: with slots_waiting, who waits for whom.
        self._learn_time = self._pump_time = 0.0

    @property
    def progress(self) -> float:
        return min(1.0, self.env_steps / self.config.total_steps)

    def dispatch_one(self) -> None:
        cfg = self.config
        stream = None
        if self.streams.book is not None:
            stream = self._free_streams.popleft()
            self._task_streams[self._task_counter] = stream
        self.channel.submit(
            TaskSpec(
                cfg.run_id,
                "rollout",
                self._task_counter,
                0,
                "latest",
                cfg.seed,
                steps=cfg.farm.steps_per_env,
                act=self.rollout_options(self.task_options(self.progress), self._task_counter, 0),
                stream=self.streams.ref(stream) if stream is not None else None,
            )
        )
        self._task_counter += 1
        if self._owed:  # this task takes the slot a finished one left: it waited this long
            self.slot_wait.waited(max(0.0, time.time() - self._owed.popleft()))

    def refill(self) -> None:
        """Keep `window` rollout tasks on the farm while the backlog has room. A slot is running or
        owed a replacement; a window that shrank closes owed slots, one that grew opens some."""
        running = self.channel.outstanding("rollout")  # held back for the run's share included
        if self.pace is not None:
            while self._owed and running + len(self._owed) > self.window:
                self._owed.popleft()
            for _ in range(self.window - running - len(self._owed)):
                self._owed.append(time.time())
        while self._owed and running < self.window and len(self._backlog) < self.max_backlog:
            self.dispatch_one()
            running += 1

    def receive(self, timeout: float) -> None:
        """Take in what has arrived: evaluations at once, rollouts into the backlog (each leaves a
        slot to refill); then refill. Waits at most `timeout` seconds for something to arrive."""
        while len(self._backlog) < self.max_backlog:  # full: results wait in Redis, tasks are not replaced
            message = self.channel.next_result(timeout=timeout)
            if message is None:
                break
            if message.kind == "eval":
                self.handle_eval(message)
            else:
                if self.streams.book is not None:  # the stream moved on, whether its result is learned or dropped
                    stream = self._task_streams.pop(message.iteration)
                    self.streams.advance(message, stream)
                    self._free_streams.append(stream)
                self._backlog.append(message)
                self._owed.append(message.finished or time.time())
                # A task's time is its acting on the worker (every rollout result says it): sent to
                # received would count the wait behind the worker's other task, and keep a window
                # that large by itself.
                if message.duration is not None:
                    self._paced_results += 1
                    self._paced_task_seconds += message.duration
            timeout = 0
        self.refill()

    def pump(self) -> None:
        """Called between the learner's steps: results keep being received and tasks sent."""
        now = time.perf_counter()
        if now - self._last_pump >= self.PUMP_SECONDS:
            self._last_pump = now
            self.receive(timeout=0)
            self._pump_time += time.perf_counter() - now

    def train_loop(self) -> None:
        cfg = self.config
        if cfg.async_.ingest == "thread":  # decoded beside the learner (rlfarm.trainer.ingest); the run is ours now
            self.channel.ingest_in_thread()
        for _ in range(self.tasks_in_flight):
            self.dispatch_one()
        while self.env_steps < cfg.total_steps:
            if not self._backlog:
                waiting = time.perf_counter()
                self.receive(timeout=1.0)
                self._waited += time.perf_counter() - waiting
            if self._backlog:
                self.consume(self._backlog.popleft())
                self.refill()
                self.maybe_evaluate()
            if time.perf_counter() - self._last_log >= self.LOG_SECONDS:
                self.log()
                if self._stop_requested:
                    break
            if self.target_reached():
                log.info("target return %g reached after %d env steps", cfg.target_return, self.env_steps)
                break
        self.discard_backlog()
        self.log()

    def discard_backlog(self) -> None:
        """Results received while the last ones were learned from, once the run is over: never
        learned from, so they are not counted as accepted either (summary: results_unused), and
        every accepted result's steps are in env_steps. A slow learner leaves more of them."""
        while self._backlog:
            self.unused_result(self._backlog.popleft())

    def unused_result(self, message: Result) -> None:
        """Also those of the tasks still out, arriving while the final policy is evaluated; their
        streams still move on, so the snapshot they name is deleted with the run's others."""
        if self.streams.book is not None and message.iteration in self._task_streams:
            self.streams.advance(message, self._task_streams.pop(message.iteration))
        super().unused_result(message)
        self.results_unused += 1

    def policy_lags(self, message: Result) -> dict[str, int] | None:
        """Several policies: each one's lag on its own line, from the line versions the result says
        acted (else those its version was published with, a whole blob's); {} for one policy, or a
        version not remembered; None: what acted is not a version of each line."""
        acted = message.lines if message.lines is not None else self.store.lines_of(message.version)
        return line_lags(acted, self.store.heads)

    def consume(self, message: Result) -> None:
        """Lag accounting, then the algorithm takes the result in and runs what updates it is ready for."""
        lag = self.version - message.version
        # With async.refresh_steps a task may end acting with a newer version than it started with:
        # lag is counted from the oldest (what max_policy_lag bounds), the end lag from the newest.
        last = message.last_version if message.last_version is not None else message.version
        self.results_refreshed += last != message.version
        # Each policy's line is bounded as the run's version is: a line version held back while the
        # run's moved on is stale data, whatever version the result names.
        lags = self.policy_lags(message)
        self.lags.record(lag, self.version - last, lags)
        if stale_result(lag, lags, self.max_policy_lag):
            self.dropped_stale += 1
            return
        rollout = Rollout.from_dict(message.rollout)
        self.took_result(message)
        self.env_steps += rollout.num_steps
        self.logger.episodes(self.env_steps, rollout.episode_returns, rollout.episode_lengths, message.version)
        self.algo.observe(rollout, policy_lag=lags or lag)
        while self.algo.ready():
            started, pumped = time.perf_counter(), self._pump_time
            self._losses = self.algo.update(self.progress, between=self.pump)
            self._learn_time += time.perf_counter() - started - (self._pump_time - pumped)
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
        return self.slot_wait.fraction(self.window, time.perf_counter() - self._interval_start)

    def learner_busy(self) -> float:
        """The fraction of the last log interval the learner spent computing updates."""
        elapsed = time.perf_counter() - self._interval_start
        return min(1.0, self._learn_time / elapsed) if elapsed > 0 else 0.0

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, state = super().checkpoint_state()
        return tensors, {
            **state,
            "task_counter": self._task_counter,
            "updates": self.updates,
            "dropped_stale": self.dropped_stale,
            "results_refreshed": self.results_refreshed,
            "lag_counts": {str(k): v for k, v in self.lags.counts.items()},
        }

    def restore(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().restore(tensors, state)
        self._task_counter = state["task_counter"] + self.RESUME_TASK_OFFSET
        self.updates, self.dropped_stale = state["updates"], state["dropped_stale"]
        self.results_refreshed = state.get("results_refreshed", 0)  # (checkpoints before it: 0)
        self.lags.restore(state["lag_counts"])

    def summary_extras(self) -> dict[str, Any]:
        return {
            "policy_lag_histogram": self.lags.histogram(),
            "results_refreshed": self.results_refreshed,
            "results_unused": self.results_unused,
            "max_policy_lag": self.max_policy_lag,
            "slots_waiting": self.slot_wait.run_fraction(),
            "tasks_in_flight": {"cap": self.tasks_in_flight, "paced": self.pace is not None, "last": self.window},
        }

    def repace(self) -> None:
        """The log interval's results, task times and waits to the pace, and its window obeyed."""
        now = time.perf_counter()
        elapsed = now - self._interval_start
        self.slot_wait.close_interval(self.window, elapsed)
        if self.pace is not None and self._paced_results:
            busy = max(0.0, elapsed - self._waited)
            self.window = self.pace.observe(self._paced_results, self._paced_task_seconds / self._paced_results, busy)
            self.max_backlog = max(self.window, self.batch_results)
        self._paced_results, self._paced_task_seconds, self._waited = 0, 0.0, 0.0

    def log(self) -> None:
        self._last_log = time.perf_counter()
        farm = {
            **self.heartbeats.scalars(),
            "farm/slots_waiting": self.slots_waiting(),
            "farm/backlog": len(self._backlog),
            "farm/window": self.window,
        }
        self.log_step(
            {
                "policy_version": self.version,
                "charts/SPS": self._sps,
                **self.algo.scalars(self.progress),
                **self.lags.scalars(),
                **{f"{name}/policy_version": number for name, number in self.store.heads.items()},
                "farm/results_dropped_stale": self.dropped_stale,
                "farm/learner_busy": self.learner_busy(),
                **farm,
                "eval/mean_return": self.evals.mean_return,
                **self._losses,
            }
        )
        self.repace()
        self.slot_wait.interval, self._interval_start = 0.0, time.perf_counter()
        self._learn_time = self._pump_time = 0.0
        if self.lags.lags:
            self.logger.histogram("farm/policy_lag_distribution", np.asarray(self.lags.lags), self.env_steps)
        self.lags.reset()
        self.heartbeat(farm=farm)
        self.on_event()
