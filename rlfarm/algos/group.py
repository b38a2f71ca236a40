"""Several policies in one run (`env.policy_map`): a network, an actor and a learner made of one per
policy, each seeing only the columns of its own agents (PURE: torch, numpy).

A multi-agent vector (rlfarm.envs.agents) puts agent k of game g in sub-env g * K + k, and the map
gives each agent a policy (`SpaceSpec.policies`, `agent_policy`). So a policy's agents are a fixed
set of columns of every rollout (`SpaceSpec.columns`), with their own observation size (the
observations are zero-padded to the largest; a policy reads its own width):

- `GroupNetwork`: the run's algorithm's network for each policy, under `nets.<policy>.`; one state
  dict, so a published version holds every policy (one version line; docs/architecture.md, decision 27);
- `GroupActor`: each policy acts for its columns, in the map's order, from the task's one generator;
- `PolicyGroup`: a learner per policy, each observing its columns only (`policy_rollout`); a frozen
  policy (`frozen = ["policy=file"]`) acts with its file's weights and never learns. Metrics come
  per policy (`<policy>/losses/...`, `<policy>/episodic_return`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.algos.acting import GroupActor, policy_tensors  # noqa: F401  (policy_tensors: re-exported)
from rlfarm.algos.base import Algorithm, prefixed, unprefixed
from rlfarm.config import PolicyConfig, RunConfig, for_policy
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.errors import ConfigError

# Rollout fields indexed (T, N, ...): a policy's columns are taken from their second axis.
_STEP_FIELDS = (
    "obs",
    "actions",
    "logprobs",
    "values",
    "rewards",
    "dones",
    "final_values",
    "next_obs",
    "terminations",
    "active",
    "action_masks",
    "next_action_masks",
)


def policy_best_file(name: str) -> str:
    """The run directory's file of policy `name`'s best evaluated version (policy names are identifiers)."""
    return f"best_policy.{name}.safetensors"


def policy_rollout(rollout: Rollout, spec: SpaceSpec, name: str) -> Rollout:
    """Policy `name`'s columns of a rollout, its observations cut to its own width. Episodes are its
    agents' (Rollout.episode_columns)."""
    n = rollout.rewards.shape[1]
    cols = spec.columns(name, n)
    dim = spec.policy_spec(name).obs_dim
    parts: dict[str, Any] = {}
    for f in fields(Rollout):
        value = getattr(rollout, f.name)
        if value is None:
            parts[f.name] = None
        elif f.name in _STEP_FIELDS:
            parts[f.name] = value[:, cols]
        elif f.name in ("last_values",):
            parts[f.name] = value[cols]
        elif f.name == "last_obs":
            parts[f.name] = value[cols]
        else:
            parts[f.name] = value
    for key in ("obs", "next_obs", "last_obs"):
        if parts[key] is not None:
            parts[key] = np.ascontiguousarray(parts[key][..., :dim])
    if rollout.episode_columns is not None:
        mine = np.isin(rollout.episode_columns, cols)
        parts["episode_returns"] = rollout.episode_returns[mine]
        parts["episode_lengths"] = rollout.episode_lengths[mine]
        parts["episode_columns"] = None
    return Rollout(**parts)


class GroupNetwork(nn.Module):
    """One network per policy of the spec, built by `build(spec_of_policy, config)`."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, build: Callable[[SpaceSpec, PolicyConfig], nn.Module]):
        super().__init__()
        self.spec = spec
        self.nets = nn.ModuleDict({name: build(spec.policy_spec(name), config) for name in spec.policies})

    def actor_snapshot(self) -> GroupActor:
        return GroupActor(self.spec, {name: net.actor_snapshot() for name, net in self.nets.items()})


class PolicyGroup(Algorithm):
    """A learner per trained policy of the map, of the run's algorithm (`learner_class`)."""

    def __init__(
        self,
        config: RunConfig,
        spec: SpaceSpec,
        device: torch.device,
        learner_class: type[Algorithm],
        frozen: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ):
        super().__init__(config, spec, device)
        self.learner_class = learner_class
        self.name = learner_class.name  # type: ignore[misc]
        self.head = learner_class.head  # type: ignore[misc]
        self.collect_next_obs = learner_class.collect_next_obs  # type: ignore[misc]
        # Each learner with its policy's own settings of the algorithm section (`policy_settings`).
        self.learners = {
            name: learner_class(for_policy(config, name), spec.policy_spec(name), device) for name in spec.policies
        }
        self.frozen = dict(frozen or {})
        for name, state in self.frozen.items():
            try:
                self._network(name).load_state_dict(state)
            except RuntimeError as exc:  # another network's tensors (other sizes, another env's policy)
                detail = " ".join(str(exc).split())[:400]
                raise ConfigError(
                    f"frozen policy {name!r}: its file is not the network its agents act with: {detail}"
                ) from None
        self.trained = [name for name in spec.policies if name not in self.frozen]
        self.loss_keys = tuple(f"{name}/{key}" for name in self.trained for key in learner_class.loss_keys)  # type: ignore[misc]
        self._returns: dict[str, list[float]] = {name: [] for name in spec.policies}

    @classmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> nn.Module:  # pragma: no cover - never called
        raise NotImplementedError("a PolicyGroup's network is GroupNetwork(spec, config, learner.build_network)")

    def _network(self, name: str) -> nn.Module:
        learner = self.learners[name]
        return learner.policy  # every learner names the network it publishes `policy`

    # ---- learning --------------------------------------------------------------------------------
    def acting(self, progress: float) -> dict[str, Any]:
        return self.learners[self.trained[0]].acting(progress)

    def on_farm(self, tasks_in_flight: int) -> None:
        for name in self.trained:
            self.learners[name].on_farm(tasks_in_flight)

    @property
    def publish_every(self) -> int:
        return self.learners[self.trained[0]].publish_every

    def batch_results(self) -> int:
        return max((self.learners[name].batch_results() for name in self.trained), default=1)

    def versions_per_result(self) -> float:
        return self.learners[self.trained[0]].versions_per_result()

    def observe(self, rollout: Rollout, policy_lag: int | Mapping[str, int]) -> None:
        """`policy_lag`: the result's, or each policy's on its own version line (rlfarm.farm.policies.lines)."""
        for name in self.spec.policies:
            own = policy_rollout(rollout, self.spec, name)
            self._returns[name].extend(own.episode_returns.tolist())
            if name not in self.frozen:
                lag = policy_lag if isinstance(policy_lag, int) else policy_lag[name]
                self.learners[name].observe(own, lag)

    def ready(self) -> bool:
        return any(self.learners[name].ready() for name in self.trained)

    def update(self, progress: float, between: Callable[[], None] | None = None) -> dict[str, float]:
        metrics: dict[str, float] = dict.fromkeys(self.loss_keys, float("nan"))
        for name in self.trained:
            if self.learners[name].ready():
                metrics.update({f"{name}/{k}": v for k, v in self.learners[name].update(progress, between).items()})
        return metrics

    def scalars(self, progress: float) -> dict[str, float]:
        row: dict[str, float] = {}
        for name in self.spec.policies:
            returns, self._returns[name] = self._returns[name], []
            row[f"{name}/episodic_return"] = float(np.mean(returns)) if returns else float("nan")
            if name not in self.frozen:
                row.update({f"{name}/{k}": v for k, v in self.learners[name].scalars(progress).items()})
        return row

    # ---- state -----------------------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name in self.spec.policies:
            if name in self.frozen:
                own = {k: v.detach().cpu() for k, v in self._network(name).state_dict().items()}
            else:
                own = self.learners[name].state()
            tensors.update(prefixed(f"nets.{name}", own))
        return tensors

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors: dict[str, torch.Tensor] = {}
        rest: dict[str, Any] = {}
        for name in self.trained:
            own, rest[name] = self.learners[name].checkpoint()
            tensors.update(prefixed(f"group.{name}", own))
        return tensors, rest

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        for name in self.trained:
            self.learners[name].restore(unprefixed(f"group.{name}", tensors), state[name])
