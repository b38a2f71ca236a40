"""What a rollout task does, outside Celery so it is testable without a broker.

Per worker process: one Redis client, run metadata, vector envs and policy snapshots reused across
tasks. The result goes onto the run's Redis list `rlfarm:<run>:results` (msgpack with raw arrays),
where the trainer BLPOPs it: popping is consuming, so nothing is left behind in Redis, and large
results never pass through Celery's pub/sub result path.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from typing import Any

import redis

from rlfarm import codec
from rlfarm.config import policy_config
from rlfarm.envs import SpaceSpec, make_env, make_vector_env
from rlfarm.policy import build_network
from rlfarm.rollout import collect, run_episodes, task_seeds
from rlfarm.store import PolicyCache, PolicyStore, run_prefix

RESULT_TTL = 3600  # backstop only: the trainer pops results as they come
MAX_ATTEMPTS = 4  # deliveries of one task id before it is refused (a task that kills its worker)


def results_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}results"


class RolloutWorker:
    def __init__(self, redis_url: str):
        self.client = redis.Redis.from_url(redis_url, socket_connect_timeout=10, socket_keepalive=True,
                                           health_check_interval=30)
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.policies = PolicyCache(size=4)
        self.envs: dict[tuple[str, int], Any] = {}
        self.runs: dict[str, dict[str, Any]] = {}

    def _run_meta(self, run: str) -> dict[str, Any]:
        if run not in self.runs:
            self.runs[run] = PolicyStore(self.client, run).run_meta()
        return self.runs[run]

    def _actor(self, run: str, version: int | str) -> tuple[Any, int, bool]:
        """The acting snapshot of a version, its number, and whether it had to be fetched."""
        store = PolicyStore(self.client, run)
        if version == "latest":
            latest = store.latest()
            version = latest if latest is not None else "latest"  # get() raises a clear error
        cached = self.policies.get((run, version))  # type: ignore[arg-type]
        if cached is not None:
            return cached, int(version), False
        state, meta = store.get(version)
        run_meta = self._run_meta(run)
        policy = build_network(run_meta["config"]["algo"], SpaceSpec.from_dict(run_meta["space"]),
                               policy_config(run_meta["config"]["policy"]))
        policy.load_state_dict(state)
        actor = policy.actor_snapshot()
        self.policies.put((run, int(meta["version"])), actor)
        return actor, int(meta["version"]), True

    def _vector_env(self, env_id: str, num_envs: int) -> Any:
        key = (env_id, num_envs)
        if key not in self.envs:
            self.envs[key] = make_vector_env(env_id, num_envs)
        return self.envs[key]

    def rollout(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run one task spec and return the result message (not yet encoded).

        kind "rollout": `steps` env steps per sub-env, exploring (epsilon-greedy when `epsilon` is set);
        kind "eval": `episodes` whole greedy episodes on one env.
        """
        started = time.perf_counter()
        kind = spec.get("kind", "rollout")
        run_meta = self._run_meta(spec["run"])
        env_cfg = run_meta["config"]["env"]
        actor, version, fetched = self._actor(spec["run"], spec["version"])
        message = {"kind": kind, "iteration": spec["iteration"], "index": spec["index"],
                   "version": version, "worker": self.identity, "policy_fetched": fetched}
        if kind == "eval":
            env = self._single_env(env_cfg["id"])
            seed = task_seeds(spec["seed"], spec["iteration"], spec["index"], 1)[0][0]
            message["returns"] = run_episodes(actor, env, spec["episodes"], seed, deterministic=True)
        else:
            if spec.get("epsilon") is not None:
                actor = actor.with_epsilon(spec["epsilon"])
            envs = self._vector_env(env_cfg["id"], env_cfg["num_envs"])
            env_seeds, action_seed = task_seeds(spec["seed"], spec["iteration"], spec["index"],
                                                envs.num_envs)
            result = collect(actor, envs, spec["steps"], env_seeds, action_seed,
                             keep_next_obs=run_meta["config"]["algo"] == "dqn")
            message["rollout"] = result.to_dict()
        message["duration"] = time.perf_counter() - started
        return message

    def _single_env(self, env_id: str) -> Any:
        key = (env_id, 0)
        if key not in self.envs:
            self.envs[key] = make_env(env_id)
        return self.envs[key]

    def handle(self, spec: dict[str, Any], task_id: str) -> None:
        """Run a task and push its result, or its error, to the run's results list."""
        key = results_key(spec["run"])
        attempts_key = f"{run_prefix(spec['run'])}attempts:{task_id}"
        pipe = self.client.pipeline()
        pipe.incr(attempts_key)
        pipe.expire(attempts_key, RESULT_TTL)
        attempts = pipe.execute()[0]
        try:
            if attempts > MAX_ATTEMPTS:
                raise RuntimeError(f"task {task_id} was delivered {attempts} times; each delivery "
                                   f"lost its worker, so it is refused")
            message = self.rollout(spec)
        except Exception as exc:  # reported to the trainer, which decides; never silently lost
            message = {"kind": spec.get("kind", "rollout"), "iteration": spec.get("iteration"),
                       "index": spec.get("index"),
                       "worker": self.identity, "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc(limit=8)}
        message["task_id"] = task_id
        pipe = self.client.pipeline()
        pipe.rpush(key, codec.pack(message))
        pipe.expire(key, RESULT_TTL)
        pipe.delete(attempts_key)
        pipe.execute()
