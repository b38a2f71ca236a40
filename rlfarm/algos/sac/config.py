"""[sac]: SAC's config section (light: no torch), its learner, its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rlfarm.errors import ConfigError
from rlfarm.sections.algo import AlgoSection, at_least_1, check_bounded_box, check_replay  # noqa: F401
from rlfarm.sections.bounds import check_learning_rate, check_replay_bounds

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig
    from rlfarm.envs import SpaceSpec


@dataclass(frozen=True)
class SACConfig(AlgoSection):
    """[sac]: Soft Actor-Critic with automatic entropy tuning (Haarnoja et al. 2018; rlfarm.algos.sac.sac).
    Names and defaults as CleanRL's sac_continuous_action and SB3's SAC."""

    algo: ClassVar[str] = "sac"
    modes: ClassVar[dict[str, str]] = {
        "async": "tasks act with the newest version when they start; results feed a replay buffer"
    }
    learners: ClassVar[dict[str, str]] = {"async": "sac:SAC"}
    mode_hint: ClassVar[str] = (
        "SAC learns off-policy from a replay buffer, so it never waits for whole "
        "groups acted with one version; use --mode async"
    )

    learning_rate: float = 3e-4  # actor, both critics and the entropy coefficient (one, as SB3)
    gamma: float = 0.99
    tau: float = 0.005  # Polyak coefficient of the target critics
    n_step: int = 1  # n-step returns, computed inside each task's transitions
    batch_size: int = 256
    buffer_size: int = 1_000_000
    learning_starts: int = 5_000  # heatup: uniform random actions in the bounds, no training
    replay_ratio: float = 1.0  # gradient steps per consumed env step (CleanRL and SB3: one per step)
    # CleanRL's delayed policy updates (TD3's trick): every policy_frequency gradient steps the actor
    # (and alpha) take policy_frequency steps, so they get as many steps as the critics.
    policy_frequency: int = 2
    target_network_frequency: int = 1  # gradient steps between Polyak updates of the target critics
    autotune: bool = True  # tune the entropy coefficient towards a target entropy of -action_dim
    initial_alpha: float = 1.0  # where autotune starts (SB3's "auto"; CleanRL's log_alpha = 0)
    alpha: float = 0.2  # the fixed entropy coefficient when autotune = false
    prioritized: bool = False  # prioritized replay by the critics' mean absolute TD error
    per_alpha: float = 0.6
    per_beta: float = 0.4  # importance-sampling exponent, annealed to 1 over the run
    per_eps: float = 1e-6

    def check(self, run: RunConfig) -> None:
        check_replay(run, "sac")
        check_replay_bounds(run, "sac")
        check_learning_rate(run, "sac.learning_rate")
        at_least_1(run, "sac.policy_frequency", "sac.target_network_frequency")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"sac.tau must be in (0, 1], got {self.tau}")
        if not self.initial_alpha > 0:  # autotune learns log(alpha)
            raise ConfigError(f"sac.initial_alpha must be positive, got {self.initial_alpha}")
        if self.alpha < 0:
            raise ConfigError(f"sac.alpha cannot be negative, got {self.alpha}")

    @classmethod
    def check_spaces(cls, spec: SpaceSpec) -> None:
        check_bounded_box("sac", spec, "scales its tanh-squashed actions")
