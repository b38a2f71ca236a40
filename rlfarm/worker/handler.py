"""What a task does on a worker, outside Celery so it is testable without a broker: its checks (the
trainer still wants it, protocol, signature, attempts), its lease, its body (rollout or evaluation)
and its answer to the trainer, whatever happens.

Per worker process: one Redis client, run metadata, vector envs, networks and policy versions
(rlfarm.worker.policies) and env streams (rlfarm.worker.streams) reused across tasks. The answer goes
onto the run's results list (rlfarm.worker.results).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from rlfarm.core import codec, protocol, signing
from rlfarm.core.league import SELF, named_version, outcomes
from rlfarm.core.protocol import Result, TaskSpec
from rlfarm.core.rollout import collect, run_episodes, task_seeds
from rlfarm.envs import make_env, make_vector_env
from rlfarm.envs.opponents import RANDOM, actor_player, scripted
from rlfarm.envs.turns import TurnVector
from rlfarm.errors import EnvFault
from rlfarm.farm import keys
from rlfarm.farm.claim import claim_incarnation
from rlfarm.farm.connection import redact
from rlfarm.farm.outage import OutageRetry, resilient_client
from rlfarm.farm.policies.machine import SharedPolicies, default_root
from rlfarm.farm.policies.store import PolicyStore
from rlfarm.worker.counters import FIELDS, NodeCounters
from rlfarm.worker.lease import Lease
from rlfarm.worker.main_process import hand_back_reason
from rlfarm.worker.policies import PolicyVersions
from rlfarm.worker.results import encode_result, push, refused_input
from rlfarm.worker.settings import WorkerSettings
from rlfarm.worker.streams import EnvStreams

MAX_ATTEMPTS = 4  # deliveries of one task id before it is refused (a task that kills its worker)


log = logging.getLogger("rlfarm.worker")


class HandedBack(Exception):
    """Raised in a pool process's task when its worker shuts down (SIGTERM to the main process, which
    signals the pool process; rlfarm.worker.main_process): the task is answered as handed back and left unfinished."""


def _handed_back(exc: BaseException) -> bool:
    """A HandedBack, or an error raised because of one: the hand-back signal can interrupt code that
    wraps what it raises (an env's constructor becomes an EnvError), and the task must still go back."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, HandedBack):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class TaskHandler:
    def __init__(
        self,
        redis_url: str,
        settings: WorkerSettings | None = None,
        *,
        counters: NodeCounters | None = None,
        stop_worker: Callable[[], None] | None = None,
        hand_back: bool = False,
    ):
        """`counters`: the worker's NodeCounters, which this process's running totals are stored into
        after each task (a pool process's: `--metrics-port` exports them); `stop_worker`: stops this
        worker (SIGTERM to its main process, which hands running tasks back), called when it cannot
        take part in the farm; `hand_back`: the hand-back signal came before this handler existed."""
        settings = settings if settings is not None else WorkerSettings.from_env()
        # Commands wait out a Redis restart (back-off, up to RLFARM_REDIS_OUTAGE_TIMEOUT seconds) instead of
        # failing the task whose result is being pushed.
        self.retry = OutageRetry(
            settings.redis_outage_timeout, where=f"Redis at {redact(redis_url)}", notify=log.warning
        )
        self.client = resilient_client(redis_url, self.retry, connect_timeout=10)
        self.secret = signing.secret_from_env()  # RLFARM_SECRET: task specs must carry its signature
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.envs: dict[tuple[str, int, str], Any] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.incarnations: dict[str, str] = {}  # run -> the trainer incarnation the caches are of
        self.counts = dict.fromkeys(FIELDS, 0)
        # Versions fetched once per machine, shared through files (RLFARM_POLICY_SHARE=off: per process).
        root = default_root(redis_url, settings.policy_share)
        self.versions = PolicyVersions(
            self.client,
            SharedPolicies(root) if root is not None else None,
            self._run_meta,
            self.incarnations,
            self.counts,
        )
        self.streams = EnvStreams(self.client)  # farm.episodes = "continue"
        self.lease = Lease(self.client)
        self.running = False  # a task is between its lease and its result: a hand-back may interrupt it
        self.hand_back = hand_back  # set by the hand-back signal: this and any later task is handed back
        self.counters = counters
        # A worker that cannot take part in the farm says why once and goes, rather than taking tasks
        # whose results would all be dropped.
        self.stop_worker = stop_worker

    def on_hand_back(self) -> None:
        """The hand-back signal's handler (rlfarm.worker.hooks): interrupt the running task where it is
        (it is only ever raised between its lease and its result), or the next one at its start."""
        self.hand_back = True
        if self.running:
            self.running = False
            raise HandedBack()

    def _enter(self, run: str, incarnation: str) -> None:
        """A task of `incarnation` of `run`: if this process cached another one (a run id reused after
        `rlfarm checkpoints delete`, a resumed trainer), forget all of it: metadata, network,
        policies and env streams could be the old run's (another num_envs, other weights)."""
        if self.incarnations.get(run) == incarnation:
            return
        if run in self.incarnations:
            self.runs.pop(run, None)
            self.versions.drop_run(run)
            self.streams.drop(run)
        self.incarnations[run] = incarnation

    def _run_meta(self, run: str) -> dict[str, Any]:
        if run not in self.runs:
            self.runs[run] = PolicyStore(self.client, run).run_meta()
        return self.runs[run]

    def _actor_of(self, run: str, version: int | str, lines: dict[str, int] | None = None) -> tuple[Any, int, bool]:
        """The acting snapshot of a version (of each policy's line version, `lines`), its number, and
        whether it had to be fetched."""
        return self.versions.actor(run, version, lines)

    def _network(self, run: str) -> Any:
        return self.versions.network(run)

    def _vector_env(self, env_cfg: dict[str, Any]) -> Any:
        key = (env_cfg["id"], env_cfg["num_envs"], _options_key(env_cfg))
        if key not in self.envs:  # env id from Redis: trusted=False (the allowlist)
            self.envs[key] = make_vector_env(env_cfg["id"], env_cfg["num_envs"], trusted=False, options=env_cfg)
        return self.envs[key]

    def _single_env(self, env_cfg: dict[str, Any]) -> Any:
        key = (env_cfg["id"], 0, _options_key(env_cfg))
        if key not in self.envs:  # env id from Redis: allowlist
            self.envs[key] = make_env(env_cfg["id"], trusted=False, options=env_cfg)
        return self.envs[key]

    def rollout(self, spec: TaskSpec) -> Result:
        """Run one task and return its result (not yet encoded).

        kind "rollout": `steps` env steps per sub-env, acting with the options in `spec.act`;
        kind "eval": `episodes` whole greedy episodes on one env.
        """
        started = time.perf_counter()
        self.counts["tasks"] += 1
        run_meta = self._run_meta(spec.run)
        env_cfg = run_meta["config"]["env"]
        actor, version, fetched = self._actor_of(spec.run, spec.version, spec.lines)
        acting = time.perf_counter()
        result = Result(
            spec.kind, spec.iteration, spec.index, version=version, worker=self.identity, policy_fetched=fetched
        )
        result.lines = self.versions.acted_lines(spec.run, version)
        if spec.kind == "eval":
            env = self._single_env(env_cfg)
            if isinstance(env, TurnVector):  # evaluation games: against the run's eval opponent
                name = run_meta["config"].get("selfplay", {}).get("eval_opponent", RANDOM)
                env.set_opponents([name], {name: scripted(name, env_cfg["id"])})
            seed = task_seeds(spec.seed, spec.iteration, spec.index, 1)[0][0]
            table = run_episodes(actor, env, spec.episodes, seed, deterministic=True, by_policy=True)
            if table.ndim == 2:  # several policies: the first one's scores the run, each is kept
                result.policy_returns = {name: table[:, j].tolist() for j, name in enumerate(actor.spec.policies)}
                table = table[:, 0]
            result.returns = table
        else:
            options = spec.collect
            opponents = options.opponents
            if opponents is not None:
                players = self._players(spec.run, actor, opponents, env_cfg["id"])
            actor = actor.with_options(**spec.acting_options())
            env_seeds, action_seed = task_seeds(spec.seed, spec.iteration, spec.index, env_cfg["num_envs"])
            refresh = None
            if spec.version == "latest" and options.refresh_steps > 0:
                refresh = self._refresher(spec, result)
            collect_kw = {
                "keep_next_obs": options.keep_next_obs,
                "refresh": refresh,
                "refresh_steps": options.refresh_steps,
            }

            def prepare(envs: Any) -> None:  # a turn-based game's opponents are the task's
                if isinstance(envs, TurnVector):
                    envs.finished = []  # the games this task ends (a continued stream held last task's)
                    if opponents is not None:
                        envs.set_opponents(opponents, players)

            if run_meta["config"]["farm"].get("episodes", "fresh") == "continue":
                rollout, envs = self.streams.collect(spec, env_cfg, actor, action_seed, result, collect_kw, prepare)
            else:
                envs = self._vector_env(env_cfg)
                prepare(envs)
                rollout = collect(actor, envs, spec.steps, env_seeds, action_seed, **collect_kw)
            if isinstance(envs, TurnVector):
                result.games = outcomes(envs.finished)
            result.rollout = rollout.to_dict()
        result.duration = time.perf_counter() - started
        result.finished = time.time()
        result.timings = {"policy": acting - started, "collect": result.duration - (acting - started)}
        return result

    def _players(self, run: str, actor: Any, names: list[str], env_id: str) -> dict[str, Any]:
        """The players a turn-based task's games name (rlfarm.core.league): the acting version
        ("self"), past versions ("v<N>", fetched and cached like any version) or scripted ones."""
        players = {}
        # Every player of a task stays cached while the task runs, and the next task likely names them
        # again: the process's cache holds a league, beside the versions it acts with.
        self.versions.cache.size = max(self.versions.cache.size, len(set(names)) + 2)
        for name in sorted(set(names)):
            version = named_version(name)
            if name == SELF:
                players[name] = actor_player(actor)
            elif version is not None:
                players[name] = actor_player(self._actor_of(run, version)[0])
            else:
                players[name] = scripted(name, env_id)
        return players

    def _refresher(self, spec: TaskSpec, result: Result) -> Any:
        """For a task acting with "latest": a callable returning the actor of a version newer than the
        one acting (or None), which it records as the result's `last_version`. One GET of the
        version pointer per call; the blob only when the version is new to this process."""
        store = PolicyStore(self.client, spec.run)
        result.last_version = result.version

        def refresh() -> Any:
            latest = store.latest()
            if latest is None or latest <= result.last_version:
                return None
            actor, result.last_version, _ = self._actor_of(spec.run, latest)
            return actor.with_options(**spec.acting_options())

        return refresh

    def handle(self, spec: dict[str, Any], task_id: str, node: str | None = None) -> str | None:
        """Run a task and push its result, or its error, to the run's results list.

        A task the trainer no longer wants (its result already counted, a superseded copy) is skipped
        without running and answered with a one-line note; one of a run whose trainer is gone is
        dropped silently. One of another protocol version is refused unrun, in one line naming both
        (`node`: the Celery node name, which the trainer's warning names).

        Returns the error the trainer was told when the task was refused or failed (its answer is
        pushed by then), else None: the Celery task then fails too (rlfarm.worker.hooks.run).
        """
        taken = time.perf_counter()
        run = spec["run"]
        key_text = keys.task(spec.get("kind", "rollout"), spec.get("iteration"), spec.get("index"))
        attempts_key = keys.attempts(run, task_id)
        pipe = self.client.pipeline()
        pipe.incr(attempts_key)
        pipe.expire(attempts_key, keys.RESULTS_TTL)
        pipe.smismember(keys.wanted(run), [keys.LIVE, key_text])
        pipe.get(keys.claim(run))
        attempts, _, (live, wanted), claim = pipe.execute()
        incarnation = spec.get("incarnation")
        live = live and incarnation is not None and claim_incarnation(claim) == incarnation
        base = Result(
            spec.get("kind", "rollout"),
            spec.get("iteration"),
            spec.get("index"),
            worker=self.identity,
            task_id=task_id,
            incarnation=incarnation,
        )
        if not live:  # its trainer is gone (its claim expired or was released) or was replaced
            log.info("skipped task %s of run %s: the run has no live trainer", key_text, run)
            self.client.delete(attempts_key)
            return None
        if not wanted:
            base.skipped = True
            self._push(run, base.to_message(), attempts_key)
            return None
        # Before anything reads the spec or the run's config: their fields mean what this protocol says.
        refusal = protocol.protocol_mismatch(protocol.spec_protocol(spec), node or self.identity)
        if refusal is not None:
            return self._refuse(run, base, refusal, node, attempts_key)
        if self.secret is None and spec.get("sig"):
            return self._no_secret(run, base, node, attempts_key)
        lease = None
        snapshot_item = None
        try:
            task = TaskSpec.from_kwargs(signing.verify_spec(spec, self.secret))
            self._enter(run, incarnation)
            if attempts > MAX_ATTEMPTS:
                raise RuntimeError(
                    f"task {task_id} was delivered {attempts} times; each delivery lost its worker, so it is refused"
                )
            run_meta = self._run_meta(run)
            # Metadata without a version was written by a trainer before versions (or by hand).
            refusal = protocol.protocol_mismatch(run_meta.get("protocol", protocol.PROTOCOL), node or self.identity)
            if refusal is not None:
                return self._refuse(
                    run, base, refusal.replace("the task protocol", "the run's metadata protocol"), node, attempts_key
                )
            farm = run_meta["config"]["farm"]
            lease = keys.lease(run, key_text)
            self.running = True
            if self.hand_back:
                raise HandedBack()
            self.lease.hold(lease, self.identity, farm.get("lease_seconds", 10.0))
            checked = time.perf_counter()
            self.streams.snapshot = None
            result = self.rollout(task)
            self.running = False
            result.task_id = task_id
            result.timings = {"checks": checked - taken, **(result.timings or {})}
            payload = encode_result(result, farm)
            done = key_text
            snapshot_item = self.streams.take_snapshot()
            failed = None
        except Exception as exc:  # reported to the trainer, which decides; never silently lost
            self.running = False
            if _handed_back(exc):  # the trainer sends it again at once; the key stays wanted
                base.error, base.retryable, base.handed_back = hand_back_reason(node or self.identity), True, True
                base.worker = node or self.identity
                done = failed = None  # not the task's fault
            else:
                base.error, base.traceback = f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8)
                base.unverified = refused_input(exc)
                if isinstance(exc, EnvFault):  # its machine's fault, not the task's: sent again
                    base.fault, base.retryable = exc.name, True
                done, failed = None, base.error
            payload = codec.pack(base.to_message())
        try:
            self._push(run, payload, attempts_key, lease, done, snapshot_item)
        finally:
            if lease is not None:
                self.lease.release()
            self._store_counts()
        return failed

    def _no_secret(self, run: str, base: Result, node: str | None, attempts_key: str) -> str:
        """The farm signs its tasks (RLFARM_SECRET) and this worker has no secret: every result it
        pushed would be dropped as unsigned. Say so in one line, hand the task back (the trainer sends
        it again to the others) and stop this worker."""
        line = (
            f"NoSecret: worker {node or self.identity} has no RLFARM_SECRET, but run {run!r} signs its "
            f"tasks: its results would be dropped. Start it with the farm's secret in RLFARM_SECRET "
            f"(`rlfarm up` keeps it in $RLFARM_HOME/local-farm.json, an embedded run in "
            f"RUN_DIR/cluster.json, docker compose in .env); this worker stops"
        )
        log.error("%s", line)
        base.error, base.retryable, base.handed_back = line, True, True
        base.worker = node or self.identity
        self._push(run, base.to_message(), attempts_key)
        if self.stop_worker is not None:
            self.stop_worker()
        return line

    def _store_counts(self) -> None:
        if self.counters is not None:
            self.counters.store(**{**self.counts, "redis_outages": self.retry.outages})

    def _refuse(self, run: str, base: Result, refusal: str, node: str | None, attempts_key: str) -> str:
        """Answer a task of another protocol without running it; the trainer sends it to others."""
        log.warning("%s", refusal)
        base.refused, base.protocol, base.error = True, protocol.PROTOCOL, refusal
        base.worker = node or self.identity
        self._push(run, base.to_message(), attempts_key)
        return refusal

    def _push(
        self,
        run: str,
        message: dict[str, Any] | bytes,
        attempts_key: str,
        lease: str | None = None,
        done: str | None = None,
        stream_snapshot: tuple[str, bytes] | None = None,
    ) -> None:
        push(self.client, self.secret, run, message, attempts_key, lease, done, stream_snapshot)


def _options_key(env_cfg: dict[str, Any]) -> str:
    """Envs are shared by runs with the same id, size and preprocessing."""
    return repr(sorted((k, v) for k, v in env_cfg.items() if k not in ("id", "num_envs")))
