"""What a finished run reports: `TrainResult` (returned by `rlfarm.train`) and RUN_DIR/summary.json,
which is the result plus the farm's counters and what the mode adds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfarm.algos.saved import describe_policy
from rlfarm.config import json_safe, to_dict
from rlfarm.core import codec
from rlfarm.runio.rundir import write_atomic
from rlfarm.trainer import counters

if TYPE_CHECKING:
    import torch

    from rlfarm.config import RunConfig
    from rlfarm.envs.spaces import SpaceSpec

FILENAME = "summary.json"


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
    best_eval_mean_return: float  # of best_version, over all its greedy episodes
    wall_seconds: float
    redispatched: int
    duplicates: int
    dropped_stale: int = 0
    task_ids_accepted: int = 0
    best_version: int | None = None  # the version with the best greedy evaluation (None: no evaluations)
    target_reached: bool = False
    final_policy: Path | None = None
    best_policy: Path | None = None  # RUN_DIR/best_policy.safetensors, when evaluations ran


def build(
    result: TrainResult,
    stats: counters.DispatchStats,
    retry: Any,
    *,
    target_reached_at: dict[str, float] | None,
    threads: int,
    extras: dict[str, Any],
) -> dict[str, Any]:
    """summary.json's content. `stats`: the task channel's DispatchStats (rlfarm.trainer.counters);
    `retry`: the trainer's Redis OutageRetry; `extras`: what the mode adds (Trainer.summary_extras)."""
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
    summary["target_reached_at"] = target_reached_at
    summary["receive_cpu_seconds"] = stats.receive_seconds
    summary["trainer_threads"] = threads  # torch threads the learner ran with (torch_threads)
    summary["unique_task_ids_accepted"] = len(set(stats.accepted_task_ids))
    counts = counters.summary_counts(stats)  # dispatched, tasks_held (held back for a shared farm's share), faults
    counts["faults"].update(redis_outages=retry.outages, redis_outage_seconds=round(retry.outage_seconds, 3))
    summary.update(counts)
    summary["security"] = {k.split("/", 1)[1]: v for k, v in stats.security().items()}
    summary["accepted_task_ids"] = stats.accepted_task_ids
    summary.update(extras)
    return summary


def write(run_dir: Path, summary: dict[str, Any]) -> Path:
    # Strict JSON: no evaluation (NaN) and a best of -inf are written as null.
    return write_atomic(Path(run_dir) / FILENAME, json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")


def write_final_policy(
    run_dir: Path, config: RunConfig, space: SpaceSpec, state: dict[str, torch.Tensor], version: int, secret: Any
) -> Path:
    """RUN_DIR/final_policy.safetensors: the policy, the version it was published as, and what it takes
    to play it again (its network's config, the run's [env] section, spaces), signed with `secret`."""
    sections = to_dict(config)
    blob = codec.encode_policy(
        state,
        {
            "version": str(version),
            "algo": config.algo,
            "run": config.run_id,
            "env": config.env.id,
            "policy": json.dumps(sections["policy"]),
            # The run's [env] section (preprocessing, env.policy_map) and the network's spaces, as
            # best_policy.safetensors has them: `rlfarm eval` plays the env the policy learned on.
            "env_options": json.dumps(sections["env"]),
            **describe_policy(config.algo, space),
        },
        secret,
    )
    path = run_dir / "final_policy.safetensors"
    write_atomic(path, blob)
    return path
