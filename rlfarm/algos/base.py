"""The algorithm interface: what a learner tells the farm, and what the trainers ask of it (PURE).

The trainers schedule (dispatch, gather, policy lag, publish cadence, evaluation, logging); an
`Algorithm` learns. Per run, one instance lives in the trainer:

    acting options -> tasks act and collect -> observe(rollout, lag) -> while ready(): update(progress)

`progress` is one convention for every algorithm: the fraction of the run done, 0 at the start and
1 at `total_steps` (learning-rate annealing, exploration and PER-beta schedules read it).
Workers use the class side only (`build_network`, `actor_snapshot`): they never construct a learner.

Adding an algorithm: a package `rlfarm/algos/<name>/` (its config section, networks and actors,
learner), its section's field in RunConfig (rlfarm/config/run.py: the field and its import) and a
preset; docs/development.md walks through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rlfarm.config import PolicyConfig, RunConfig
    from rlfarm.core.rollout import Rollout
    from rlfarm.envs import SpaceSpec
    from rlfarm.nn.acting import Actor
    from rlfarm.nn.adam import Adam


class Algorithm(ABC):
    """One learner. Subclasses declare the class attributes and implement the abstract methods."""

    name: ClassVar[str]  # as in `algo = "..."`; its config section is rlfarm.config.ALGORITHMS[name]
    head: ClassVar[str]  # the network's output module (actor, q): how a saved policy's sizes are read
    # What every rollout task of this algorithm must collect beyond the on-policy arrays: the real
    # next observation of each step and which episode ends were terminations (replay needs them).
    collect_next_obs: ClassVar[bool] = False
    # Metric keys `update` returns, logged as NaN until the first update, so every row of
    # progress.csv has the same columns.
    loss_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        self.run_config = config
        self.config: Any = config.algo_config  # this run's section of the algorithm (a subclass reads its own)
        self.spec = spec
        self.device = device

    # ---- class side: also used by workers and `rlfarm eval` --------------------------------------
    @classmethod
    @abstractmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> nn.Module:
        """The network this algorithm trains and workers act with, chosen from the env's spec."""

    @classmethod
    def actor_snapshot(cls, network: nn.Module) -> Actor:
        """A frozen snapshot of `network` to act with on a worker (numpy where it pays, else torch)."""
        return network.actor_snapshot()

    # ---- the learner ---------------------------------------------------------------------------
    def acting(self, progress: float) -> dict[str, Any]:
        """Acting options for the next rollout task (travel in the task's `act` field), e.g. epsilon."""
        return {}

    @abstractmethod
    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        """Take in one result (SYNC: the whole group). `policy_lag`: trainer version minus the version
        the result was acted with (0 in SYNC)."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether an update can run now on what was observed."""

    @abstractmethod
    def update(self, progress: float, between: Callable[[], None] | None = None) -> dict[str, float]:
        """One update (PPO: the epochs over an iteration; DQN: one gradient step); its metrics.
        A long update calls `between()` now and then (after each minibatch): the ASYNC trainer keeps
        receiving results and sending tasks there, so the farm never waits on the learner."""

    def on_farm(self, tasks_in_flight: int) -> None:  # noqa: B027 - a hook most algorithms ignore
        """Told, in ASYNC mode, how many tasks the trainer keeps in flight (APPO sizes its batch by it)."""

    @property
    def publish_every(self) -> int:
        """ASYNC: updates between published versions."""
        return self.run_config.async_.publish_interval

    def batch_results(self) -> int:
        """ASYNC: results an update takes at once (APPO: `async.results_per_update`); the trainer's
        backlog holds that many, so the farm acts the next batch while the learner learns this one."""
        return 1

    def versions_per_result(self) -> float:
        """ASYNC: policy versions published per result taken in, what a result's policy lag grows by
        for each result learned from while it is in flight (`async.max_policy_lag = "auto"`)."""
        return 1.0 / self.publish_every

    def scalars(self, progress: float) -> dict[str, float]:
        """Extra values for every log line (exploration rate, replay size, ...)."""
        return {}

    @abstractmethod
    def state(self) -> dict[str, torch.Tensor]:
        """The weights workers act with (CPU tensors): what a published version holds."""

    @abstractmethod
    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything needed to continue learning bit-identically: tensors and a JSON-able rest."""

    @abstractmethod
    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        """The inverse of `checkpoint`."""


# ---- pure state-dict helpers (checkpoints are written by rlfarm.trainer.resume) ------------------------


def prefixed(prefix: str, tensors: Mapping[str, Any]) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def unprefixed(prefix: str, tensors: Mapping[str, Any]) -> dict[str, Any]:
    head = prefix + "."
    return {k[len(head) :]: v for k, v in tensors.items() if k.startswith(head)}


def optimizer_state(optimizer: Adam, prefix: str = "optim") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer's state_dict split into tensors and a JSON-able rest."""
    import torch

    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for index, entries in sd["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{prefix}.{index}.{name}"] = value
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(
    optimizer: Adam,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    prefix: str = "optim",
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in unprefixed(prefix, tensors).items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def networks_state(
    networks: Mapping[str, Any], optimizers: Mapping[str, Adam]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Several networks' and optimizers' state for a checkpoint, each under its prefix: tensors, and the
    optimizers' JSON-able rest by prefix (restore_networks reads them back)."""
    tensors: dict[str, Any] = {}
    for prefix, network in networks.items():
        tensors.update(prefixed(prefix, network.state_dict()))
    meta: dict[str, Any] = {}
    for prefix, optimizer in optimizers.items():
        optim_tensors, meta[prefix] = optimizer_state(optimizer, prefix)
        tensors.update(optim_tensors)
    return tensors, meta


def restore_networks(
    networks: Mapping[str, Any],
    optimizers: Mapping[str, Adam],
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
) -> None:
    for prefix, network in networks.items():
        network.load_state_dict(unprefixed(prefix, tensors))
    for prefix, optimizer in optimizers.items():
        load_optimizer_state(optimizer, tensors, meta[prefix], prefix)


def to_device(array: Any, device: torch.device) -> torch.Tensor:
    """A numpy batch as a tensor on `device`, dtype kept (uint8 images stay uint8 until the network
    scales them, a quarter of float32's bytes over PCIe). To CUDA through pinned host memory with a
    non-blocking copy, so the copy overlaps the work already queued on the GPU."""
    import torch

    tensor = torch.as_tensor(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
