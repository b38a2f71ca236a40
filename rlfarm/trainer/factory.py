"""Building a trainer: everything it talks to or learns with, made here and passed in.

`make_trainer` checks the run's mode and spaces, describes the env, refuses an evicting Redis,
connects (with the outage clock), and builds, in this order, where forged keys are told
(`RefusedKeys`), the policy store, the run's claim, the Celery app, the link to the farm
(`FarmLink`), the learner, the evaluation bookkeeping and a factory of the RunLogger (opened by
`Trainer.train` once the run is claimed, since it writes the run directory), then the trainer. The
trainer opens its task channel and watchdog from the link as their owner (rlfarm.trainer.channel):
they talk to it through that one object, given when they are made. The trainer classes'
constructors do no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rlfarm.algos import check_mode, learner
from rlfarm.config import RunConfig, to_dict, trainer_threads
from rlfarm.core import signing
from rlfarm.envs import describe
from rlfarm.errors import ConfigError
from rlfarm.evaluation.bookkeeping import Evaluations
from rlfarm.farm.app import make_app
from rlfarm.farm.claim import Claim
from rlfarm.farm.connection import connect, no_secret_warning, redact, refuse_eviction
from rlfarm.farm.guard import guarded_client
from rlfarm.farm.policies.lines import LinedStore
from rlfarm.farm.policies.store import FROM_ENV, PolicyStore
from rlfarm.observe.metrics import RunLogger
from rlfarm.trainer.asynchronous import AsyncTrainer
from rlfarm.trainer.base import LogStep, Trainer
from rlfarm.trainer.channel import FarmLink, ShareTerms
from rlfarm.trainer.counters import DispatchStats
from rlfarm.trainer.dispatch import RefusedKeys
from rlfarm.trainer.ingest import keep_freed_memory
from rlfarm.trainer.log import warn
from rlfarm.trainer.parts import FarmParts, LearningParts, RunIO
from rlfarm.trainer.sync import SyncTrainer


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def frozen_policies(config: RunConfig, space: Any) -> dict[str, dict[str, torch.Tensor]]:
    """The weights of each frozen policy (`frozen = ["policy=file"]`), read with RLFARM_SECRET's check,
    from a single policy's file or one policy of a group's (its `nets.<policy>.` tensors)."""
    from rlfarm.algos.group import policy_tensors
    from rlfarm.config.checks import parse_frozen
    from rlfarm.core import codec
    from rlfarm.errors import SignatureError

    weights = {}
    for name, path in parse_frozen(config.frozen):
        try:
            state, _ = codec.decode_policy(Path(path).read_bytes(), signing.secret_from_env())
        except OSError as exc:
            raise ConfigError(f"frozen policy {name!r}: cannot read {path}: {exc.strerror or exc}") from None
        except (codec.CodecError, SignatureError) as exc:
            raise ConfigError(f"frozen policy {name!r}: {exc} (file {path})") from None
        weights[name] = policy_tensors(state, name)
    return weights


def make_trainer(
    config: RunConfig,
    redis_url: str,
    run_dir: Path,
    console: Console | None = None,
    resume: bool = False,
    callback: Callable[[LogStep], bool | None] | None = None,
    local_workers: int = 0,
    secret: Any = FROM_ENV,
    capture_video: bool = False,
    tracking: Any = None,
    **mode_options: Any,
) -> Trainer:
    """The trainer of the run's mode (the algorithm is the config's; rlfarm.algos checks it can run so).

    `resume`: continue the run in `run_dir` from its trainer checkpoint (see rlfarm.trainer.resume).
    `callback(LogStep)`: called after each log step; returning False stops the run.
    `local_workers`: worker processes of this run on this machine (the embedded default's), whose
    cores the trainer's threads leave to them (rlfarm.config.trainer_threads).
    `secret`: what signs and checks the run's data in Redis (default RLFARM_SECRET; the embedded
    default and `rlfarm up` make one of their own). Files in the run directory are signed with
    RLFARM_SECRET only, so they verify wherever the user's secret does.
    `capture_video`: record a greedy episode of each evaluated version (rlfarm.observe.video).
    `tracking`: an rlfarm.observe.tracking.Tracking to log the run to MLflow.
    `mode_options`: ASYNC's `tasks_in_flight` (ignored in SYNC)."""
    cls = AsyncTrainer if config.mode == "async" else SyncTrainer
    if cls is SyncTrainer:
        mode_options.pop("tasks_in_flight", None)
    check_mode(config.algo, config.mode)
    run_dir = Path(run_dir)
    console = console or Console()
    device = resolve_device(config.device)
    space = describe(config.env.id, to_dict(config)["env"])
    config.algo_config.check_spaces(space)
    probe = connect(redis_url)  # fails fast and clearly when Redis is not there at the start
    try:
        refuse_eviction(probe, redis_url)  # before anything is written that Redis could drop
    finally:
        probe.close()
    # From here on, every Redis command waits out an outage of up to farm.redis_outage_timeout.
    # ... and a key of the run found of another type than the trainer writes is refused and rewritten:
    # the guard, the store and the claim tell `refused`, and the watchdog has the trainer write back.
    refused = RefusedKeys(DispatchStats())
    client, retry = guarded_client(
        redis_url,
        config.run_id,
        config.farm.redis_outage_timeout,
        where=f"Redis at {redact(redis_url)}",
        warn=warn,
        refused=refused.report,
    )
    keep = config.farm.keep_versions
    if len(space.policies) > 1:  # a version line per policy beside the run's (rlfarm.farm.policies.lines)
        store: PolicyStore = LinedStore(
            client, config.run_id, space.policies, keep=keep, secret=secret, on_forged=refused.report
        )
    else:
        store = PolicyStore(client, config.run_id, keep=keep, secret=secret, on_forged=refused.report)
    claim = Claim(client, config.run_id, secret=store.secret, on_forged=refused.report)
    app = make_app(redis_url)

    keep_freed_memory()  # results' arrays reuse freed heap instead of faulting fresh pages in
    threads = trainer_threads(config, space.is_image, local_workers)
    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)  # the network's initial weights
    if space.policies:  # env.policy_map: a learner per policy (rlfarm.algos.group)
        from rlfarm.algos.group import PolicyGroup

        frozen = frozen_policies(config, space)
        algo = PolicyGroup(config, space, device, learner(config.algo, config.mode), frozen)
    else:
        algo = learner(config.algo, config.mode)(config, space, device)
    farm = config.farm
    # The trainer opens its task channel and watchdog from this link, as their owner (FarmLink.open).
    link = FarmLink(
        app,
        client,
        config.run_id,
        farm.task_timeout,
        farm.max_redispatch,
        env=config.env.id,  # shown in Flower's task labels
        lease_seconds=farm.lease_seconds,
        time_limit=farm.task_time_limit,
        retry=retry,
        claim=claim,
        secret=store.secret,
        share=ShareTerms(redis_url, farm.share, config.mode),
        refused=refused,
    )

    sinks: list[Callable[[], Any]] = []
    if capture_video:
        from rlfarm.observe.video import EvalVideos

        # From the store's pinned copy: an evaluated version is pinned until its evaluation is logged.
        sinks.append(lambda: EvalVideos(run_dir, config, space, store.pinned.get, store.secret))
    if tracking is not None:
        from rlfarm.observe.tracking import MlflowRun

        sinks.append(lambda: MlflowRun(tracking, run_dir, to_dict(config), resume=resume))

    def open_logger(resume_state: dict[str, Any] | None) -> RunLogger:
        return RunLogger(run_dir, to_dict(config), config.total_steps, console, resume=resume_state, sinks=sinks)

    return cls(
        config,
        learning=LearningParts(space, device, threads, algo),
        farm=FarmParts(client, retry, store, claim, link),
        io=RunIO(run_dir, open_logger, signing.secret_from_env(), no_secret_warning(redis_url, store.secret)),
        evaluations=Evaluations(config),
        resume=resume,
        callback=callback,
        **mode_options,
    )
