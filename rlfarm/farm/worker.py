"""What a rollout task does, outside Celery so it is testable without a broker.

Per worker process: one Redis client, run metadata, vector envs and policy snapshots reused across
tasks. The result goes onto the run's Redis list `rlfarm:<run>:results` (msgpack with raw arrays),
where the trainer BLPOPs it: popping is consuming, so nothing is left behind in Redis, and large
results never pass through Celery's pub/sub result path.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any, Callable

import redis

from rlfarm.core import codec, protocol, signing
from rlfarm.algos import learner
from rlfarm.farm.claim import claim_incarnation
from rlfarm.farm import keys
from rlfarm.config import policy_config
from rlfarm.envs import SpaceSpec, make_env, make_vector_env
from rlfarm.core.protocol import Result, TaskSpec
from rlfarm.farm.node import hand_back_reason
from rlfarm.core import streams
from rlfarm.core.rollout import collect, run_episodes, task_seeds
from rlfarm.core.streams import EnvStream, StreamCache, stream_seeds
from rlfarm.envs import snapshot
from rlfarm.farm.outage import DEFAULT_LIMIT as DEFAULT_OUTAGE_LIMIT
from rlfarm.farm.outage import OutageRetry, is_oom, resilient_client
from rlfarm.farm.cache import PolicyCache
from rlfarm.farm.counters import FIELDS, NodeCounters
from rlfarm.farm.machine import SharedPolicies, default_root
from rlfarm.farm.connection import redact
from rlfarm.farm.store import PolicyCorrupt, PolicyStore


MAX_STREAMS = 8  # env streams ("continue" episodes) one process keeps, of any runs; LRU beyond (then restored)
MAX_NETWORKS = 4  # runs whose network one process keeps to load new versions into; LRU beyond
MAX_ATTEMPTS = 4  # deliveries of one task id before it is refused (a task that kills its worker)


log = logging.getLogger("rlfarm.worker")


class _Lease:
    """Holds `rlfarm:<run>:lease:<task>` while a task runs: set with a short expiry and renewed from a
    thread, so the trainer can tell a task that is running (however long) from one whose worker died
    (the lease expires within `seconds`). A hung env keeps renewing; the task's time limit ends it.

    One per worker process, whose thread is started by the first task and kept: a thread started
    and joined for every task cost each task 0.3-0.5 ms on an idle machine and several ms on a busy
    one (benchmarks/task_cost.py, scale.py), more than the rest of its checks. A renewal racing the
    result's push may set the key once more after the push deleted it, as a renewal in flight always
    could; it expires within `seconds`, and the trainer looks at leases of tasks still wanted only."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._held: tuple[str, str, int] | None = None  # key, holder, expiry in ms
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def hold(self, key: str, holder: str, seconds: float) -> None:
        """Set the lease now and renew it until `release` (or the next `hold`)."""
        ms = max(int(seconds * 1000), 100)
        self.client.set(key, holder, px=ms)
        with self._changed:
            self._held = (key, holder, ms)
            self._changed.notify()
        if self._thread is None or not self._thread.is_alive():  # first task (of this forked process)
            self._thread = threading.Thread(target=self._renew, name="rlfarm-lease", daemon=True)
            self._thread.start()

    def release(self) -> None:
        """Stop renewing; the key itself is deleted with the result (RolloutWorker._push)."""
        with self._changed:
            self._held = None
            self._changed.notify()

    def _renew(self) -> None:
        while True:
            with self._changed:
                while self._held is None:
                    self._changed.wait()
                held = self._held
                self._changed.wait(held[2] / 4000)
                if self._held is not held:  # released or replaced meanwhile: look again
                    continue
            try:
                self.client.set(held[0], held[1], px=held[2])
            except Exception as exc:  # noqa: BLE001 - the task goes on; an outage may outlast the lease
                log.warning("cannot renew lease %s: %s", held[0], exc)


class HandedBack(Exception):
    """Raised in a pool process's task when its worker shuts down (SIGTERM to the main process, which
    signals the pool process; rlfarm.farm.node): the task is answered as handed back and left unfinished."""


class ResultTooLarge(ValueError):
    """A result over the run's `farm.max_result_bytes`: refused before it is sent."""


class RolloutWorker:
    def __init__(self, redis_url: str):
        # Commands wait out a Redis restart (back-off, up to RLFARM_REDIS_OUTAGE_TIMEOUT seconds) instead of
        # failing the task whose result is being pushed.
        limit = float(os.environ.get("RLFARM_REDIS_OUTAGE_TIMEOUT", DEFAULT_OUTAGE_LIMIT))
        self.retry = OutageRetry(limit, where=f"Redis at {redact(redis_url)}", notify=log.warning)
        self.client = resilient_client(redis_url, self.retry, connect_timeout=10)
        self.secret = signing.secret_from_env()  # RLFARM_SECRET: task specs must carry its signature
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.policies = PolicyCache(size=4)
        # One network per run, built once and loaded with each new version's weights: building it
        # (torch's weight initialisation) was most of fetching a version, paid by every process for
        # every version (benchmarks/task_cost.py).
        # Actors are snapshots (numpy copies, or a deep copy for torch), so older cached versions
        # keep their own weights.
        self.networks: OrderedDict[str, Any] = OrderedDict()
        self.envs: dict[tuple[str, int, str], Any] = {}
        self.streams = StreamCache(MAX_STREAMS)  # farm.episodes = "continue": (run, stream) -> its envs here
        self.stream_snapshot: tuple[str, bytes] | None = None  # the last task's stream snapshot: key, blob
        self.runs: dict[str, dict[str, Any]] = {}
        self.incarnations: dict[str, str] = {}  # run -> the trainer incarnation the caches above are of
        self.lease = _Lease(self.client)
        self.running = False  # a task is between its lease and its result: a hand-back may interrupt it
        self.hand_back = False  # set by the hand-back signal: this and any later task is handed back
        # This process's running totals, stored after each task into its worker's NodeCounters (set
        # by rlfarm.farm.worker_app in a worker's pool process), which `--metrics-port` exports.
        self.counters: NodeCounters | None = None
        # Versions fetched once per machine, shared through files (RLFARM_POLICY_SHARE=off: per process).
        root = default_root(redis_url)
        self.shared = SharedPolicies(root) if root is not None else None
        self.counts = dict.fromkeys(FIELDS, 0)
        # Stops this worker (rlfarm.farm.worker_app: SIGTERM to its main process, which hands running
        # tasks back): a worker that cannot take part in the farm says why once and goes, rather than
        # taking tasks whose results would all be dropped.
        self.stop_worker: Callable[[], None] | None = None

    def on_hand_back(self) -> None:
        """The hand-back signal's handler (tasks/__init__.py): interrupt the running task where it is
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
            self.networks.pop(run, None)
            self.policies.drop_run(run)
            self.streams.drop(run)
        self.incarnations[run] = incarnation

    def _run_meta(self, run: str) -> dict[str, Any]:
        if run not in self.runs:
            self.runs[run] = PolicyStore(self.client, run).run_meta()
        return self.runs[run]

    def _actor_of(self, run: str, version: int | str) -> tuple[Any, int, bool]:
        """The acting snapshot of a version, its number, and whether it had to be fetched."""
        store = PolicyStore(self.client, run)
        if version == "latest":
            latest = store.latest()
            version = latest if latest is not None else "latest"  # get() raises a clear error
        if version != "latest":
            version = int(version)
        cached = self.policies.get((run, version))  # type: ignore[arg-type]
        if cached is not None:
            return cached, int(version), False
        state, fetched = self._checked_version(store, run, int(version))
        algorithm = learner(self._run_meta(run)["config"]["algo"])
        network = self._network(run)
        network.load_state_dict(state)
        actor = algorithm.actor_snapshot(network)
        self.policies.put((run, int(version)), actor)
        return actor, int(version), fetched

    def _checked_version(self, store: PolicyStore, run: str, version: int) -> tuple[dict[str, Any], bool]:
        """A version's tensors, checked (sha256, the hmac with RLFARM_SECRET, that the blob is the
        version and run of its key), and whether this process fetched it from Redis: not when another
        process of this machine had (rlfarm.farm.machine). The process's cache is keyed by the version
        fetched, never by what the blob says about itself."""
        incarnation = self.incarnations.get(run)
        if self.shared is None or incarnation is None or not self.shared.usable():
            return self._fetch(store, version)[0], True  # (no incarnation: not a task's; nothing to key by)
        path = self.shared.path(run, incarnation, version)
        blob = self.shared.read(path)  # whole or absent: files are written beside and renamed
        if blob is None:
            with self.shared.locked(path) as held:  # one process of the machine fetches, the others wait
                blob = self.shared.read(path) if held else None
                if blob is None:
                    state, blob = self._fetch(store, version)
                    if held:
                        self.shared.write(path, blob, version)
                    return state, True
        try:
            return store.check(version, blob)[0], False
        except PolicyCorrupt:  # a damaged copy: removed, and this process fetches for itself
            self.shared.drop(path)
            return self._fetch(store, version)[0], True

    def _fetch(self, store: PolicyStore, version: int) -> tuple[dict[str, Any], bytes]:
        blob = store.get_blob(version)
        self.counts["policy_fetches"] += 1
        self.counts["policy_fetch_bytes"] += len(blob)
        return store.check(version, blob)[0], blob

    def _network(self, run: str) -> Any:
        """The run's network, to load a version's weights into (built on first use; LRU of runs)."""
        if run in self.networks:
            self.networks.move_to_end(run)
            return self.networks[run]
        run_meta = self._run_meta(run)
        network = learner(run_meta["config"]["algo"]).build_network(
            SpaceSpec.from_dict(run_meta["space"]), policy_config(run_meta["config"]["policy"]))
        self.networks[run] = network
        while len(self.networks) > MAX_NETWORKS:
            self.networks.popitem(last=False)
        return network

    def _vector_env(self, env_cfg: dict[str, Any]) -> Any:
        key = (env_cfg["id"], env_cfg["num_envs"], _options_key(env_cfg))
        if key not in self.envs:  # env id from Redis: trusted=False (the allowlist)
            self.envs[key] = make_vector_env(env_cfg["id"], env_cfg["num_envs"], trusted=False, options=env_cfg)
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
        actor, version, fetched = self._actor_of(spec.run, spec.version)
        acting = time.perf_counter()
        result = Result(spec.kind, spec.iteration, spec.index, version=version, worker=self.identity,
                        policy_fetched=fetched)
        if spec.kind == "eval":
            env = self._single_env(env_cfg)
            seed = task_seeds(spec.seed, spec.iteration, spec.index, 1)[0][0]
            result.returns = run_episodes(actor, env, spec.episodes, seed, deterministic=True)
        else:
            actor = actor.with_options(**spec.acting_options())
            env_seeds, action_seed = task_seeds(spec.seed, spec.iteration, spec.index, env_cfg["num_envs"])
            keep_next_obs = bool(spec.act.get("keep_next_obs", False))
            refresh_steps = int(spec.act.get("refresh_steps", 0))
            refresh = None
            if spec.version == "latest" and refresh_steps > 0:
                refresh = self._refresher(spec, result)
            collect_kw = {"keep_next_obs": keep_next_obs, "refresh": refresh, "refresh_steps": refresh_steps}
            if run_meta["config"]["farm"].get("episodes", "fresh") == "continue":
                rollout = self._continue(spec, env_cfg, actor, action_seed, result, collect_kw)
            else:
                envs = self._vector_env(env_cfg)
                rollout = collect(actor, envs, spec.steps, env_seeds, action_seed, **collect_kw)
            result.rollout = rollout.to_dict()
        result.duration = time.perf_counter() - started
        result.finished = time.time()
        result.timings = {"policy": acting - started, "collect": result.duration - (acting - started)}
        return result

    def _continue(self, spec: TaskSpec, env_cfg: dict[str, Any], actor: Any, action_seed: int,
                  result: Result, collect_kw: dict[str, Any]) -> Any:
        """A task of an env stream (farm.episodes = "continue"): go on from the snapshot the spec names,
        at once when this process holds the stream there, else restored from Redis; start it from its
        seeds when the spec names none (or the snapshot is lost). The stream's new snapshot goes to
        Redis with the result (`handle`); the result names it (rlfarm.core.streams)."""
        ref = spec.stream
        if not isinstance(ref, dict) or not isinstance(ref.get("index"), int):
            raise protocol.ProtocolError('a farm.episodes = "continue" task must name its env stream')
        index, after, restarts = ref["index"], ref.get("after"), int(ref.get("restarts", 0))
        report: dict[str, Any] = {"index": index, "restored": False}
        started = time.perf_counter()
        stream = self.streams.get(spec.run, index)
        if stream is None or after is None or stream.digest != after:
            envs = stream.envs if stream is not None else make_vector_env(
                env_cfg["id"], env_cfg["num_envs"], trusted=False, options=env_cfg)
            stream = EnvStream(envs, stream_seeds(spec.seed, index, restarts, env_cfg["num_envs"]))
            self.streams.put(spec.run, index, stream)
            if after is not None:
                try:
                    blob = self.client.get(keys.stream(spec.run, after))
                    if blob is None:
                        raise streams.SnapshotError(f"snapshot {after[:12]} is not in Redis (expired, or "
                                                    f"Redis lost its data)")
                    streams.resume(stream, streams.decode(blob, after), snapshot.restore)
                    report["restored"] = True
                except (streams.SnapshotError, ValueError) as exc:  # lost or not ours: start it anew
                    restarts += 1
                    stream.first_seeds = stream_seeds(spec.seed, index, restarts, env_cfg["num_envs"])
                    stream.obs = None
                    report["restart"] = str(exc)
                    log.warning("env stream %d of run %s restarts from new seeds: %s", index, spec.run, exc)
        restored = time.perf_counter() - started
        try:
            rollout = collect(actor, stream.envs, spec.steps, [], action_seed, stream=stream, **collect_kw)
            saving = time.perf_counter()
            blob, digest = streams.encode(stream, snapshot.capture(stream.envs))
        except BaseException:
            self.streams.drop(spec.run, index)  # half-stepped: the snapshot in Redis is still the truth
            raise
        stream.digest = digest
        self.stream_snapshot = (keys.stream(spec.run, digest), blob)
        result.stream = {**report, "digest": digest, "restarts": restarts, "bytes": len(blob),
                         "seconds": restored + time.perf_counter() - saving}
        return rollout

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

    def _single_env(self, env_cfg: dict[str, Any]) -> Any:
        key = (env_cfg["id"], 0, _options_key(env_cfg))
        if key not in self.envs:  # env id from Redis: allowlist
            self.envs[key] = make_env(env_cfg["id"], trusted=False, options=env_cfg)
        return self.envs[key]

    def handle(self, spec: dict[str, Any], task_id: str, node: str | None = None) -> str | None:
        """Run a task and push its result, or its error, to the run's results list.

        A task the trainer no longer wants (its result already counted, a superseded copy) is skipped
        without running and answered with a one-line note; one of a run whose trainer is gone is
        dropped silently. One of another protocol version is refused unrun, in one line naming both
        (`node`: the Celery node name, which the trainer's warning names).

        Returns the error the trainer was told when the task was refused or failed (its answer is
        pushed by then), else None: the Celery task then fails too (rlfarm.farm.worker_app.run).
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
        base = Result(spec.get("kind", "rollout"), spec.get("iteration"), spec.get("index"),
                      worker=self.identity, task_id=task_id, incarnation=incarnation)
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
                raise RuntimeError(f"task {task_id} was delivered {attempts} times; each delivery "
                                   f"lost its worker, so it is refused")
            run_meta = self._run_meta(run)
            # Metadata without a version was written by a trainer before versions (or by hand).
            refusal = protocol.protocol_mismatch(run_meta.get("protocol", protocol.PROTOCOL), node or self.identity)
            if refusal is not None:
                return self._refuse(run, base, refusal.replace("the task protocol", "the run's metadata protocol"),
                                    node, attempts_key)
            farm = run_meta["config"]["farm"]
            lease = keys.lease(run, key_text)
            self.running = True
            if self.hand_back:
                raise HandedBack()
            self.lease.hold(lease, self.identity, farm.get("lease_seconds", 10.0))
            checked = time.perf_counter()
            self.stream_snapshot = None
            result = self.rollout(task)
            self.running = False
            result.task_id = task_id
            result.timings = {"checks": checked - taken, **(result.timings or {})}
            payload = encode_result(result, farm)
            done = key_text
            snapshot_item, self.stream_snapshot = self.stream_snapshot, None
            failed = None
        except HandedBack:  # the trainer sends it again at once; the key stays wanted
            self.running = False
            base.error, base.retryable, base.handed_back = hand_back_reason(node or self.identity), True, True
            base.worker = node or self.identity
            payload = codec.pack(base.to_message())
            done = failed = None  # not the task's fault: the trainer sends it again at once
        except Exception as exc:  # reported to the trainer, which decides; never silently lost
            self.running = False
            base.error, base.traceback = f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8)
            base.unverified = refused_input(exc)
            payload = codec.pack(base.to_message())
            done, failed = None, base.error
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
        line = (f"NoSecret: worker {node or self.identity} has no RLFARM_SECRET, but run {run!r} signs its "
                f"tasks: its results would be dropped. Start it with the farm's secret in RLFARM_SECRET "
                f"(`rlfarm up` keeps it in $RLFARM_HOME/local-farm.json, an embedded run in "
                f"RUN_DIR/cluster.json, docker compose in .env); this worker stops")
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

    def _push(self, run: str, message: dict[str, Any] | bytes, attempts_key: str,
              lease: str | None = None, done: str | None = None,
              stream_snapshot: tuple[str, bytes] | None = None) -> None:
        """Result, attempts counter, lease and `wanted` entry in one transaction: the trainer never
        sees a lease gone before its result is there, and from now on every other copy of the
        task (`done`) is skipped unrun. An env stream's snapshot goes in the same transaction, so
        the result that names it never arrives without it."""
        payload = signing.seal_result(run, message if isinstance(message, bytes) else codec.pack(message),
                                      self.secret)
        key = keys.results(run)
        pipe = self.client.pipeline(transaction=True)
        if stream_snapshot is not None:
            pipe.set(stream_snapshot[0], stream_snapshot[1], ex=keys.STREAM_TTL)
        pipe.rpush(key, payload)
        pipe.expire(key, keys.RESULTS_TTL)
        pipe.delete(attempts_key, *([lease] if lease else []))
        if done is not None:
            pipe.srem(keys.wanted(run), done)
        try:
            pipe.execute()
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # Nothing smaller would fit either (noeviction refuses every write past maxmemory); the
            # trainer's own writes fail the same way and it says so in one line.
            log.error("cannot push the result of %s to run %s: Redis is out of memory (%s); free memory "
                      "or raise its maxmemory", attempts_key.rsplit(":", 1)[-1], run, exc)


def refused_input(exc: BaseException) -> str | None:
    """Which of a task's inputs failed its checks, if that is why the task failed: "spec" (its
    signature), "meta" (the run metadata's) or "policy" (the blob's hmac, sha256, version or run)."""
    if isinstance(exc, PolicyCorrupt):
        return "policy"
    if isinstance(exc, signing.SignatureError):  # signing names what it checked: "task spec", "metadata"
        return "spec" if "task spec" in str(exc) else "meta"
    return None


def _options_key(env_cfg: dict[str, Any]) -> str:
    """Envs are shared by runs with the same id, size and preprocessing."""
    return repr(sorted((k, v) for k, v in env_cfg.items() if k not in ("id", "num_envs")))


def encode_result(result: Result, farm: dict[str, Any]) -> bytes:
    """The result's bytes as the run's `farm.compress` asks, refused when too large for Redis or for
    the trainer to decode."""
    message = result.to_message()
    decoded = codec.array_bytes(message)
    if decoded > codec.MAX_DECODED_BYTES:  # the trainer would refuse to decompress it
        raise ResultTooLarge(
            f"the result's arrays hold {_mib(decoded)}, over the {_mib(codec.MAX_DECODED_BYTES)} a trainer "
            f"decodes from one result; make tasks smaller (fewer env.num_envs or farm.steps_per_env)")
    # A run meta without the key was written by a trainer older than compression, which could not
    # decode a compressed array (an unknown msgpack extension): such runs get raw arrays.
    payload = codec.pack(message, compress=farm.get("compress", "none"))
    limit = int(farm.get("max_result_bytes", 0))
    if limit and len(payload) > limit:  # what goes into Redis: the compressed size
        raise ResultTooLarge(
            f"the result is {_mib(len(payload))}, over farm.max_result_bytes ({_mib(limit)}); "
            f"make tasks smaller (fewer env.num_envs or farm.steps_per_env) or raise the limit")
    return payload


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
