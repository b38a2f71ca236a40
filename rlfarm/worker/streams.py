"""A worker process's env streams (farm.episodes = "continue"): a task goes on from the snapshot its
spec names, at once when this process holds the stream there, else restored from Redis; the stream's
new snapshot goes to Redis with the task's result (rlfarm.worker.results.push), which names it
(rlfarm.core.streams)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from rlfarm.core import protocol, streams
from rlfarm.core.protocol import Result, TaskSpec
from rlfarm.core.rollout import Rollout, collect
from rlfarm.core.streams import EnvStream, StreamCache, stream_seeds
from rlfarm.envs import make_vector_env, snapshot
from rlfarm.envs.agents import AgentVector
from rlfarm.farm import keys

MAX_STREAMS = 8  # env streams one process keeps, of any runs; LRU beyond (then restored)

log = logging.getLogger("rlfarm.worker")


class EnvStreams:
    def __init__(self, client: redis.Redis, size: int = MAX_STREAMS):
        self.client = client
        self.cache = StreamCache(size)  # (run, stream) -> its envs here
        self.snapshot: tuple[str, bytes] | None = None  # the last task's stream snapshot: key, blob
        self.configs: dict[str, snapshot.Configuration] = {}  # what a probe of each env showed

    def drop(self, run: str) -> None:
        """Forget the run's streams (another incarnation of it)."""
        self.cache.drop(run)

    def configuration(self, env_cfg: dict[str, Any], envs: Any) -> snapshot.Configuration:
        """The env's configuration, which no snapshot may change (rlfarm.envs.snapshot.configuration),
        learned once per process and env on a probe of one sub-env or game."""
        key = json.dumps(env_cfg, sort_keys=True, default=str)
        if key not in self.configs:
            per_game = envs.k if isinstance(envs, AgentVector) else 1
            probe = make_vector_env(env_cfg["id"], per_game, trusted=False, options=env_cfg)
            try:
                self.configs[key] = snapshot.configuration(probe)
            finally:
                with contextlib.suppress(Exception):
                    probe.close()
        return self.configs[key]

    def take_snapshot(self) -> tuple[str, bytes] | None:
        """The snapshot the last task left for its result's push, handed over once."""
        item, self.snapshot = self.snapshot, None
        return item

    def collect(
        self,
        spec: TaskSpec,
        env_cfg: dict[str, Any],
        actor: Any,
        action_seed: int,
        result: Result,
        collect_kw: dict[str, Any],
        prepare: Callable[[Any], None] = lambda envs: None,
    ) -> tuple[Rollout, Any]:
        """The task's steps of its stream, and the stream's envs; start it from its seeds when the spec
        names no snapshot (or the snapshot is lost). The result says how (`result.stream`). `prepare`
        is called on the envs, where they stand, before the first step (a game's opponents)."""
        ref = spec.stream
        if not isinstance(ref, dict) or not isinstance(ref.get("index"), int):
            raise protocol.ProtocolError('a farm.episodes = "continue" task must name its env stream')
        index, after, restarts = ref["index"], ref.get("after"), int(ref.get("restarts", 0))
        report: dict[str, Any] = {"index": index, "restored": False}
        started = time.perf_counter()
        stream = self.cache.get(spec.run, index)
        if stream is None or after is None or stream.digest != after:
            envs = (
                stream.envs
                if stream is not None
                else make_vector_env(env_cfg["id"], env_cfg["num_envs"], trusted=False, options=env_cfg)
            )
            stream = EnvStream(envs, stream_seeds(spec.seed, index, restarts, env_cfg["num_envs"]))
            self.cache.put(spec.run, index, stream)
            if after is not None:
                try:
                    blob = self.client.get(keys.stream(spec.run, after))
                    if blob is None:
                        raise streams.SnapshotError(
                            f"snapshot {after[:12]} is not in Redis (expired, or Redis lost its data)"
                        )
                    message = streams.decode(blob, after)
                    config = self.configuration(env_cfg, stream.envs)
                    streams.resume(stream, message, lambda envs, state: snapshot.restore(envs, state, config))
                    report["restored"] = True
                except Exception as exc:  # lost, not ours, or not data it restores: start it anew
                    # on fresh envs: a restore that failed half way may have written some of the
                    # blob's values into these (a forged blob nested too deep, a wrong sub-env count).
                    restarts += 1
                    with contextlib.suppress(Exception):
                        stream.envs.close()
                    envs = make_vector_env(env_cfg["id"], env_cfg["num_envs"], trusted=False, options=env_cfg)
                    stream = EnvStream(envs, stream_seeds(spec.seed, index, restarts, env_cfg["num_envs"]))
                    self.cache.put(spec.run, index, stream)
                    why = exc if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                    report["restart"] = str(why)[:300]
                    if isinstance(exc, streams.SnapshotForged):
                        report["forged"] = True
                    log.warning(
                        "env stream %d of run %s restarts from new seeds: %s", index, spec.run, report["restart"]
                    )
        restored = time.perf_counter() - started
        try:
            prepare(stream.envs)
            rollout = collect(actor, stream.envs, spec.steps, [], action_seed, stream=stream, **collect_kw)
            saving = time.perf_counter()
            blob, digest = streams.encode(stream, snapshot.capture(stream.envs))
        except BaseException:
            self.cache.drop(spec.run, index)  # half-stepped: the snapshot in Redis is still the truth
            raise
        stream.digest = digest
        self.snapshot = (keys.stream(spec.run, digest), blob)
        result.stream = {
            **report,
            "digest": digest,
            "restarts": restarts,
            "bytes": len(blob),
            "seconds": restored + time.perf_counter() - saving,
        }
        return rollout, stream.envs
