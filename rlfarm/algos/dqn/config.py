"""[dqn]: DQN's config section (light: no torch), its learner, its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rlfarm.errors import ConfigError
from rlfarm.sections.algo import AlgoSection, at_least_1, check_replay  # noqa: F401
from rlfarm.sections.bounds import check_learning_rate, check_replay_bounds

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig
    from rlfarm.envs import SpaceSpec


@dataclass(frozen=True)
class DQNConfig(AlgoSection):
    """[dqn]: Double DQN with n-step returns and optional prioritized replay (rlfarm.algos.dqn.dqn)."""

    algo: ClassVar[str] = "dqn"
    modes: ClassVar[dict[str, str]] = {
        "async": "tasks act with the newest version when they start; results feed a replay buffer"
    }
    learners: ClassVar[dict[str, str]] = {"async": "dqn:DQN"}
    mode_hint: ClassVar[str] = "it learns from a replay buffer and never waits for whole groups"

    learning_rate: float = 1e-3
    anneal_lr: bool = False  # decay the learning rate linearly to 0 over total_steps
    gamma: float = 0.99
    n_step: int = 1  # n-step returns, computed inside each task's transitions
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1_000  # heatup: random actions, no training, until this many transitions
    replay_ratio: float = 0.5  # gradient steps per consumed env step
    target_update_interval: int = 250  # gradient steps between hard target updates (tau = 1)
    tau: float = 1.0  # 1: hard copy every target_update_interval; < 1: Polyak every gradient step
    max_grad_norm: float = 10.0
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    exploration_fraction: float = 0.1  # of total_steps over which epsilon decays linearly
    prioritized: bool = False
    per_alpha: float = 0.6
    per_beta: float = 0.4  # importance-sampling exponent, annealed to 1 over the run
    per_eps: float = 1e-6

    def check(self, run: RunConfig) -> None:
        check_replay(run, "dqn")
        check_replay_bounds(run, "dqn")
        check_learning_rate(run, "dqn.learning_rate")
        at_least_1(run, "dqn.target_update_interval")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"dqn.tau must be in (0, 1], got {self.tau}")

    @classmethod
    def check_spaces(cls, spec: SpaceSpec) -> None:
        if not spec.discrete:
            raise ConfigError("algo 'dqn' needs a discrete action space; use ppo for continuous actions")
