"""What a task carries and what a result returns: one definition, used by the trainer, the dispatcher,
the Celery task, the worker, Flower's label and the tests (PURE).

A task travels as Celery kwargs (`TaskSpec.to_kwargs`, msgpack-safe, signed as a whole with
RLFARM_SECRET); a result travels as a msgpack map on the run's results list (`Result`). Algorithm-
specific options travel in one nested field, `act` (e.g. {"epsilon": 0.05, "keep_next_obs": true}),
never in the task signature, so a new algorithm needs no new task fields. See docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from rlfarm.errors import ProtocolError

RELEASE = "0.1.0"  # this release of rlfarm (rlfarm.__version__; setup.cfg reads it here), which workers report

# The protocol version: what a task spec, a result and a run's metadata mean between a trainer and a
# worker. Bump it with any change a worker of the other version would misread or refuse (a new field of
# TaskSpec, Result or the run meta, a changed config key). Tasks and run metadata carry it; a worker
# refuses a task of another protocol in one line naming both (docs/architecture.md, decision 16).
PROTOCOL = 9  # 2: farm.share (fair shares between runs); 3: farm.policy_dtype (float16 versions);
# 4: env streams of the run (TaskSpec.stream, Result.stream), ppo.vf_loss, ppo.anneal_clip, reference;
# 5: tasks travel on the queue of their protocol (TASK_QUEUE), claims are signed; 6: turn-based games
# (act["opponents"], Result.games, Rollout.action_masks, the [selfplay] section); 7: an evaluation of
# several policies returns each one's (Result.policy_returns); 8: a run of several policies has a
# version line per policy (TaskSpec.lines, rlfarm.farm.policies.lines); 9: a policy blob's signature covers its
# line fields, workers act with the lines a run version's metadata names, results say which (Result.lines)


def task_queue(protocol: int) -> str:
    """The broker queue of tasks of `protocol`: only workers that speak it consume it, so a worker of
    another rlfarm never takes (and refuses, and hands back) a task it cannot run (decision 16)."""
    return f"rlfarm.p{protocol}"


TASK_QUEUE = task_queue(PROTOCOL)

KINDS = ("rollout", "eval")
# What of a task's inputs a worker checks against the farm's secret (Result.unverified).
UNVERIFIED_INPUTS = ("policy", "meta", "spec")
ROLLOUT_TASK = "rlfarm.rollout"
EVAL_TASK = "rlfarm.evaluate"

Key = tuple[str, int, int]  # (kind, iteration, index): a task's identity within its run


@dataclass(frozen=True)
class CollectOptions:
    """What the worker collects, read from a task's `act` (TaskSpec.collect); the rest of `act` are
    acting options for the actor. On the wire they stay keys of `act`, as every protocol had them."""

    keep_next_obs: bool = False  # off-policy learners: the real next observation of every step
    refresh_steps: int = 0  # ASYNC "latest": look for a newer version every this many steps (0: never)
    opponents: list[Any] | None = None  # turn-based games (rlfarm.core.league): who plays the other seats

    @classmethod
    def from_act(cls, act: dict[str, Any]) -> CollectOptions:
        opponents = act.get("opponents")
        return cls(bool(act.get("keep_next_obs", False)), int(act.get("refresh_steps", 0)), opponents)


COLLECT_OPTIONS = tuple(f.name for f in dataclasses.fields(CollectOptions))


def spec_protocol(kwargs: dict[str, Any]) -> Any:
    """The protocol version of a task as it came off the wire (0: sent before there were versions)."""
    return kwargs.get("protocol", 0)


def protocol_mismatch(task_protocol: Any, worker: str) -> str | None:
    """The one line a worker of this protocol answers a task of `task_protocol` with, or None when
    it speaks that protocol."""
    if task_protocol == PROTOCOL:
        return None
    newer = isinstance(task_protocol, int) and task_protocol > PROTOCOL
    fix = (
        "upgrade this worker to the trainer's rlfarm"
        if newer
        else "this trainer is older than this worker: upgrade it, or run a worker of its version"
    )
    return (
        f"ProtocolMismatch: worker {worker} speaks rlfarm protocol {PROTOCOL}, the task protocol "
        f"{task_protocol}{' (sent before protocol versions)' if task_protocol == 0 else ''}; "
        f"refused without running it ({fix})"
    )


@dataclass(frozen=True)
class TaskSpec:
    run: str
    kind: str  # "rollout": `steps` env steps per sub-env; "eval": `episodes` greedy episodes
    iteration: int  # SYNC iteration, ASYNC task number, or evaluation number
    index: int  # the task's index within its iteration
    version: int | str  # the policy version to act with, or "latest" (the newest when it starts)
    seed: int  # the run seed; env and action seeds come from (seed, iteration, index)
    steps: int = 0
    episodes: int = 0
    act: dict[str, Any] = field(default_factory=dict)  # the algorithm's acting and collect options
    incarnation: str | None = (
        None  # the sending trainer's nonce (rlfarm.farm.claim): workers run the task only while it lives
    )
    env: str | None = None  # the run's env id, a label for Flower only: workers take it from the run
    protocol: int = PROTOCOL  # the trainer's; on the wire a spec without it is of protocol 0
    # farm.episodes = "continue": the env stream the task continues (rlfarm.core.streams):
    # {"index": i, "after": snapshot digest or None (start it), "restarts": n (its seeds' restart count)}
    stream: dict[str, Any] | None = None
    # A run of several policies: the version of each policy's own line that run version `version` is
    # made of (rlfarm.farm.policies.lines), e.g. {"adversary": 12, "agent": 0}; None: one policy, or "latest".
    lines: dict[str, int] | None = None
    sig: str | None = None  # HMAC over all other fields (rlfarm.core.signing), when RLFARM_SECRET is set

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProtocolError(f"task kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def key(self) -> Key:
        return (self.kind, self.iteration, self.index)

    @property
    def task_name(self) -> str:
        """Two Celery task names, one implementation: Flower tells rollouts from evaluations."""
        return EVAL_TASK if self.kind == "eval" else ROLLOUT_TASK

    def acting_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.act.items() if k not in COLLECT_OPTIONS}

    @property
    def collect(self) -> CollectOptions:
        """The collect options `act` carries, typed."""
        return CollectOptions.from_act(self.act)

    def to_kwargs(self) -> dict[str, Any]:
        """The Celery kwargs: every field that is set (unset: None, 0 steps or episodes, empty act)."""
        kwargs = {
            "run": self.run,
            "kind": self.kind,
            "iteration": self.iteration,
            "index": self.index,
            "version": self.version,
            "seed": self.seed,
            "protocol": self.protocol,
        }
        for name in ("steps", "episodes"):
            if getattr(self, name):
                kwargs[name] = getattr(self, name)
        if self.act:
            kwargs["act"] = dict(self.act)
        if self.incarnation is not None:
            kwargs["incarnation"] = self.incarnation
        if self.stream is not None:
            kwargs["stream"] = dict(self.stream)
        if self.lines is not None:
            kwargs["lines"] = dict(self.lines)
        for name in ("env", "sig"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> TaskSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ProtocolError(f"task spec has unknown fields {unknown}")
        missing = sorted(f for f in ("run", "iteration", "index", "version", "seed") if f not in kwargs)
        if missing:
            raise ProtocolError(f"task spec lacks fields {missing}")
        values = dict(kwargs)
        values.setdefault("kind", "rollout")
        values["act"] = dict(values.get("act") or {})
        return cls(**values)

    def label(self) -> str:
        """A short kwargsrepr for Flower and worker events, never a data blob:
        `run=cartpole-1 v=latest it=12 idx=1 steps=256 seed=1 eps=0.05 env=CartPole-v1`.
        What varies from task to task comes before the env (Flower cuts a cell at ~50 characters)."""
        parts = [f"run={self.run}", f"v={self.version}", f"it={self.iteration}", f"idx={self.index}"]
        if self.lines is not None:  # each policy's own version: `agent=v3` (Flower shows the pace of each)
            parts[2:2] = [f"{name}=v{number}" for name, number in self.lines.items()]
        if self.stream is not None:
            parts.append(f"stream={self.stream.get('index')}")
        parts += [f"{name}={getattr(self, name)}" for name in ("steps", "episodes") if getattr(self, name)]
        parts.append(f"seed={self.seed}")
        parts += [f"{_SHORT.get(k, k)}={v}" for k, v in self.acting_options().items()]
        if self.env is not None:
            parts.append(f"env={self.env}")
        return " ".join(parts)


_SHORT = {"epsilon": "eps"}


class Outcome(enum.Enum):
    """What a copy of a task came back as: one of these, never two (Result.outcome)."""

    RESULT = "result"  # it ran: its rollout or evaluation
    SKIPPED = "skipped"  # not run: its task had already counted
    HANDED_BACK = "handed_back"  # not finished: its worker is shutting down (SIGTERM)
    REFUSED = "refused"  # not run: the task is of another protocol version than the worker's
    UNVERIFIED = "unverified"  # not run: an input (spec, run metadata, policy) was not signed by the farm
    FAILED = "failed"  # it failed on its worker: `error` says why, `retryable` whether to send it again


@dataclass
class Result:
    """What a worker pushes for a task: the data (`rollout` arrays or eval `returns`), or an `error`,
    or `skipped` (the task was already counted; not run)."""

    kind: str
    iteration: int
    index: int
    task_id: str | None = None
    incarnation: str | None = None  # the task's (rlfarm.farm.claim): a trainer drops results of another one
    worker: str = ""
    version: int | None = None  # the version acted with (for "latest": the one it resolved to)
    last_version: int | None = None  # ASYNC with async.refresh_steps: the version acting at the end
    # Several policies (env.policy_map): each policy's line version `version` was made of, as acted
    # (rlfarm.farm.policies.lines): the trainer measures and bounds each policy's lag from it.
    lines: dict[str, int] | None = None
    duration: float | None = None  # seconds the task ran on its worker
    finished: float | None = None  # when the worker pushed it (its wall clock, epoch seconds)
    policy_fetched: bool = False  # the worker fetched the policy from Redis (not from its cache)
    # Where the task's time went on its worker, in seconds (benchmarks/task_cost.py reads them):
    # "checks" (the Redis checks, the signature and the lease before the rollout), "policy" (finding
    # the actor: cache or fetch) and "collect" (the rest of `duration`: stepping the envs). The task
    # started on the worker at finished - duration - checks. Encoding and pushing come after.
    timings: dict[str, float] | None = None
    rollout: dict[str, Any] | None = None  # rollout.Rollout.to_dict()
    returns: Any = None  # eval: episode returns
    # eval of several policies (env.policy_map): each policy's agents' mean return per game, by policy
    policy_returns: dict[str, list[float]] | None = None
    error: str | None = None
    traceback: str | None = None
    retryable: bool = False  # a failure the trainer re-sends (a hard time limit, an env's fault), not a bug
    # With `error` and `retryable`: the fault the env named (rlfarm.errors.EnvFault), its counter's name.
    fault: str | None = None
    skipped: bool = False
    refused: bool = False  # not run: the task is of another protocol than the worker's (`protocol`)
    protocol: int | None = None  # with `refused`: the worker's protocol version
    handed_back: bool = False  # not finished: its worker is shutting down (SIGTERM); sent again at once
    # With RLFARM_SECRET, what of the task's inputs did not verify ("spec", "meta" or "policy"): written
    # by someone without the secret; the trainer writes back its own copy and re-sends the task.
    unverified: str | None = None
    # farm.episodes = "continue": where the task left its stream (rlfarm.core.streams): {"index",
    # "digest" of the snapshot saved with the result, "restarts", "bytes", "seconds" spent saving and
    # restoring, "restored": the process restored the stream from its snapshot, "restart": why a lost
    # snapshot made it start the stream from new seeds}
    stream: dict[str, Any] | None = None
    # Turn-based games (rlfarm.envs.turns): the learner's wins, draws and losses against each opponent
    # in the games that ended in the task ({"v12": [3, 0, 1], "self": [...], "random": [...]}).
    games: dict[str, list[int]] | None = None

    @property
    def key(self) -> Key:
        return (self.kind, self.iteration, self.index)

    @property
    def outcome(self) -> Outcome:
        """What this copy came back as. On the wire as the flags a worker sets (`skipped`, `handed_back`,
        `unverified` with `error`, `handed_back`, `refused`, `error`): the first set, in that order, decides."""
        if self.skipped:
            return Outcome.SKIPPED
        if self.error is not None and self.unverified in UNVERIFIED_INPUTS:
            return Outcome.UNVERIFIED
        if self.handed_back:
            return Outcome.HANDED_BACK
        if self.refused:
            return Outcome.REFUSED
        if self.error is not None:
            return Outcome.FAILED
        return Outcome.RESULT

    def to_message(self) -> dict[str, Any]:
        """The msgpack map: set fields only."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("kind", "iteration", "index") or not (value is None or value is False):
                out[f.name] = value
        return out

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Result:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in message.items() if k in known})
