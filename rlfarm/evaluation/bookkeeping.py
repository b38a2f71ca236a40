"""A run's greedy-evaluation bookkeeping, pure: when to evaluate, what is in flight, the confirmation
of an evaluation at the target, the best version and which versions must stay pinned.

No Redis, no files, no torch. Each call returns decisions (`Send`, `Record`, `WriteBest`, `Unpin`)
that the trainer carries out in order with its store, task channel and logger (rlfarm.trainer.base).
Its state travels in the trainer checkpoint under the keys `state()` writes. See docs/architecture.md
(1. Data flow: evaluation tasks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlfarm.config import RunConfig
from rlfarm.core.protocol import TaskSpec

# Added to the run seed: evaluations and their confirmations play episodes training never saw.
EVAL_SEED = 1_000_003
CONFIRM_SEED = 2_000_029


@dataclass(frozen=True)
class Send:
    """Pin `version` (retention must not trim it while its tasks run), then send `tasks`."""

    version: int
    tasks: tuple[TaskSpec, ...]


@dataclass(frozen=True)
class Record:
    """An evaluation finished: log its episodes, at the env step it was sent at."""

    env_steps: int
    returns: list[float]
    version: int
    confirmation: bool = False
    by_policy: dict[str, float] | None = None  # several policies: each one's mean return


@dataclass(frozen=True)
class WriteBest:
    """`version` is the new best: write it to best_policy.safetensors with its score."""

    version: int
    score: float


@dataclass(frozen=True)
class WritePolicyBest:
    """Several policies: `policy`'s agents scored their best in `version`'s evaluation: write that
    policy of `version` to best_policy.<policy>.safetensors (before the version may be unpinned)."""

    policy: str
    version: int
    score: float


@dataclass(frozen=True)
class Unpin:
    """Nothing needs `version` any more: let retention trim it."""

    version: int


Decision = Send | Record | WriteBest | WritePolicyBest | Unpin


@dataclass
class InFlight:
    """One evaluation whose tasks are out."""

    env_steps: int
    version: int
    tasks: int
    confirm: bool = False  # a confirmation of an evaluation that reached the target
    returns: list[float] = field(default_factory=list)
    by_policy: dict[str, list[float]] = field(default_factory=dict)  # several policies' returns
    done: int = 0


class Evaluations:
    def __init__(self, config: RunConfig):
        self.config = config
        self.next_eval = config.eval.interval  # env steps at which the next evaluation is due
        self.counter = 0  # evaluation numbers (task keys) are never reused, across resumes too
        self.in_flight: dict[int, InFlight] = {}
        self.mean_return = math.nan  # the last evaluation's (confirmations aside)
        self.best_mean_return = -math.inf  # of best_version, over all its episodes
        self.best_version: int | None = None
        self.last_version: int | None = None  # the last version evaluated (confirmations aside)
        self.awaiting: dict[int, list[float]] = {}  # version -> its first evaluation's returns
        self.target_reached = False
        # Several policies: each one's best evaluation (version, mean return), ranked on its own. The
        # run's best above is the first policy's.
        self.policy_best: dict[str, tuple[int, float]] = {}
        self.policy_mean: dict[str, float] = {}  # each policy's in the last evaluation

    def start(self, version: int, env_steps: int, confirm: bool = False) -> Send:
        """An evaluation of `version` now; `confirm`: `eval.confirm_episodes` more episodes, other seeds."""
        cfg = self.config.eval
        episodes = cfg.confirm_episodes if confirm else cfg.episodes
        number = self.counter
        self.counter += 1
        self.in_flight[number] = InFlight(env_steps, version, cfg.tasks, confirm)
        if not confirm:
            self.last_version = version
        per_task = math.ceil(episodes / cfg.tasks)
        seed = self.config.seed + (CONFIRM_SEED if confirm else EVAL_SEED)
        return Send(
            version,
            tuple(
                TaskSpec(self.config.run_id, "eval", number, index, version, seed=seed, episodes=per_task)
                for index in range(cfg.tasks)
            ),
        )

    def due(self, env_steps: int, version: int) -> list[Decision]:
        """The scheduled evaluation, every `eval.interval` env steps (one, however many were passed)."""
        interval = self.config.eval.interval
        if not interval or env_steps < self.next_eval:
            return []
        send = self.start(version, env_steps)
        while self.next_eval <= env_steps:
            self.next_eval += interval
        return [send]

    def final(self, env_steps: int, version: int) -> list[Decision]:
        """At the end of every run, `eval.interval` = 0 included: the final policy gets an evaluation
        (unless it just had one), so every run has a best policy and its final score."""
        if self.last_version != version:
            return [self.start(version, env_steps)]
        return []

    def received(
        self, number: int, returns: Any, env_steps: int, by_policy: dict[str, Any] | None = None
    ) -> list[Decision]:
        """One evaluation task's episode returns; `env_steps`: the run's now (a confirmation started
        here is logged at it). `by_policy`: a run of several policies' returns of each policy."""
        ev = self.in_flight[number]
        ev.returns += [float(r) for r in returns]
        for name, values in (by_policy or {}).items():
            ev.by_policy.setdefault(name, []).extend(float(r) for r in values)
        ev.done += 1
        if ev.done < ev.tasks:
            return []
        del self.in_flight[number]
        mean = float(np.mean(ev.returns))
        target = self.config.target_return
        if ev.confirm:
            # One lucky evaluation must not end the run: the target counts only once more episodes,
            # with other seeds, agree. The version's score is the mean over all its episodes.
            first = self.awaiting.pop(ev.version)
            if mean >= target:
                self.target_reached = True
            return [
                Record(ev.env_steps, ev.returns, ev.version, confirmation=True),
                *self._settle(ev.version, float(np.mean(first + ev.returns))),
            ]
        self.mean_return = mean
        means = {name: float(np.mean(values)) for name, values in ev.by_policy.items() if values}
        self.policy_mean.update(means)
        record = Record(ev.env_steps, ev.returns, ev.version, by_policy=means or None)
        bests = self._policy_bests(ev.version, means)
        # Without scheduled evaluations the target is the rolling training return's (Trainer.target_reached):
        # a confirmation of the final evaluation would decide nothing.
        if (
            mean >= target
            and self.config.eval.confirm_episodes
            and self.config.eval.interval
            and ev.version not in self.awaiting
        ):
            self.awaiting[ev.version] = ev.returns
            return [record, *bests, self.start(ev.version, env_steps, confirm=True)]
        if mean >= target:
            self.target_reached = True
        return [record, *bests, *self._settle(ev.version, mean)]

    def _policy_bests(self, version: int, means: dict[str, float]) -> list[Decision]:
        """Each policy whose agents beat their best evaluation: its part of `version` is its new best."""
        decisions: list[Decision] = []
        for name, score in means.items():
            if name not in self.policy_best or score > self.policy_best[name][1]:
                self.policy_best[name] = (version, score)
                decisions.append(WritePolicyBest(name, version, score))
        return decisions

    def _settle(self, version: int, score: float) -> list[Decision]:
        """A version's evaluation is final: keep it as the best policy if it is, else let it go."""
        if score > self.best_mean_return:
            previous = self.best_version
            self.best_version, self.best_mean_return = version, score
            if previous is not None and previous != version:
                return [WriteBest(version, score), *self._release(previous)]
            return [WriteBest(version, score)]
        return self._release(version)

    def _release(self, version: int) -> list[Decision]:
        return [] if version in self.pinned() else [Unpin(version)]

    def pinned(self) -> set[int]:
        """Versions that must stay in Redis: the best, those being evaluated or awaiting a confirmation."""
        versions = {ev.version for ev in self.in_flight.values()} | set(self.awaiting)
        return versions | ({self.best_version} if self.best_version is not None else set())

    # ---- the trainer checkpoint's keys (rlfarm.trainer.resume) --------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "next_eval": self.next_eval,
            "eval_counter": self.counter,
            "eval_mean_return": self.mean_return,
            "best_eval_mean_return": self.best_mean_return,
            "best_version": self.best_version,
            "target_reached": self.target_reached,
            "policy_best": {name: list(best) for name, best in self.policy_best.items()},
            "policy_mean": dict(self.policy_mean),
        }

    def restore(self, state: dict[str, Any], task_offset: int = 0) -> None:
        """`task_offset`: added to the evaluation numbers, past those of tasks a dead trainer sent.
        Evaluations in flight and awaited confirmations died with that trainer."""
        self.next_eval = state["next_eval"]
        self.counter = state["eval_counter"] + task_offset
        self.mean_return = state["eval_mean_return"]
        self.best_mean_return = state["best_eval_mean_return"]
        self.best_version = state.get("best_version")
        self.target_reached = state.get("target_reached", False)  # (checkpoints before it: False)
        self.policy_best = {name: (int(v), float(score)) for name, (v, score) in state.get("policy_best", {}).items()}
        self.policy_mean = dict(state.get("policy_mean", {}))
