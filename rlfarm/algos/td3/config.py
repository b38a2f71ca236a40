"""[td3]: TD3's config section (light: no torch), its learner, its checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rlfarm.errors import ConfigError
from rlfarm.sections.algo import AlgoSection, at_least_1, check_bounded_box, check_replay
from rlfarm.sections.bounds import check_learning_rate, check_replay_bounds

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig
    from rlfarm.envs import SpaceSpec


@dataclass(frozen=True)
class TD3Config(AlgoSection):
    """[td3]: Twin Delayed DDPG (Fujimoto et al. 2018; rlfarm.algos.td3.td3). Names and defaults as
    Stable-Baselines3's TD3; the exploration noise is the paper's N(0, 0.1) (SB3 has none by default,
    its zoo adds a normal noise of std 0.1)."""

    algo: ClassVar[str] = "td3"
    modes: ClassVar[dict[str, str]] = {
        "async": "tasks act with the newest version when they start; results feed a replay buffer"
    }
    learners: ClassVar[dict[str, str]] = {"async": "td3:TD3"}
    mode_hint: ClassVar[str] = (
        "TD3 learns off-policy from a replay buffer, so it never waits for whole "
        "groups acted with one version; use --mode async"
    )

    learning_rate: float = 1e-3  # actor and both critics (SB3)
    gamma: float = 0.99
    tau: float = 0.005  # Polyak coefficient of the target actor and critics
    n_step: int = 1  # n-step returns, computed inside each task's transitions
    batch_size: int = 256
    buffer_size: int = 1_000_000
    learning_starts: int = 100  # heatup: uniform random actions in the bounds, no training
    replay_ratio: float = 1.0  # gradient steps per consumed env step (SB3: one per env step)
    # Delayed policy updates: the actor and the targets are updated every policy_delay critic steps.
    policy_delay: int = 2
    # Target policy smoothing: N(0, target_policy_noise) clipped to +-target_noise_clip is added to the
    # target actor's action, in unit scale (actions mapped to [-1, 1], as the critics see them).
    target_policy_noise: float = 0.2
    target_noise_clip: float = 0.5
    # Exploration: the deterministic action plus N(0, exploration_noise) in unit scale (std times the
    # bounds' half-range in env scale), clipped to the bounds.
    exploration_noise: float = 0.1
    prioritized: bool = False  # prioritized replay by the critics' mean absolute TD error
    per_alpha: float = 0.6
    per_beta: float = 0.4  # importance-sampling exponent, annealed to 1 over the run
    per_eps: float = 1e-6

    def check(self, run: RunConfig) -> None:
        check_replay(run, "td3")
        check_replay_bounds(run, "td3")
        check_learning_rate(run, "td3.learning_rate")
        at_least_1(run, "td3.policy_delay")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"td3.tau must be in (0, 1], got {self.tau}")
        for key in ("target_policy_noise", "target_noise_clip", "exploration_noise"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"td3.{key} must be a finite number, 0 or more, got {value}")

    @classmethod
    def check_spaces(cls, spec: SpaceSpec) -> None:
        check_bounded_box("td3", spec, "maps its tanh actions")
