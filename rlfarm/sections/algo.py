"""What every algorithm's config section is (`AlgoSection`), and the checks sections share. An
algorithm's section lives in its own package (`rlfarm/algos/<name>/config.py`) and is a typed field of
RunConfig (rlfarm.config.run); nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from rlfarm.errors import ConfigError

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig
    from rlfarm.envs import SpaceSpec

# `async` is a Python keyword: the field is `async_`, users and files say `async`.
FIELD = {"async": "async_"}


def get(config: Any, key: str) -> Any:
    """A dotted key's value (`ppo.gamma`, `async.refresh_steps`)."""
    obj: Any = config
    for part in key.split("."):
        obj = getattr(obj, FIELD.get(part, part))
    return obj


def at_least_1(run: RunConfig, *keys: str) -> None:
    for key in keys:
        if get(run, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {get(run, key)}")


def check_bounded_box(algo: str, spec: Any, maps: str) -> None:
    """An algorithm whose tanh actions are mapped to the action space's bounds (SAC, TD3) needs a Box
    with finite bounds; `maps` says what it maps, for the message."""
    if spec.discrete:
        raise ConfigError(
            f"algo '{algo}' needs a Box (continuous) action space, the env has "
            f"{spec.action_dim} discrete actions; use ppo or dqn for discrete actions"
        )
    bounds = (*spec.action_low, *spec.action_high)
    if not all(math.isfinite(x) for x in bounds):
        raise ConfigError(
            f"algo '{algo}' {maps} to the action space's bounds and needs finite ones, the "
            f"env's are low={list(spec.action_low)} high={list(spec.action_high)}; wrap the "
            f"env in gymnasium's RescaleAction with finite bounds, or use ppo"
        )


def check_replay(run: RunConfig, section: str) -> None:
    """The replay fields every off-policy section has (rlfarm.algos.offpolicy reads them)."""
    at_least_1(run, f"{section}.batch_size", f"{section}.buffer_size", f"{section}.n_step")
    if get(run, f"{section}.replay_ratio") < 0:
        raise ConfigError(f"{section}.replay_ratio cannot be negative")


class AlgoSection:
    """The light half of an algorithm, what a config needs without importing torch: its name, the
    modes it runs in (what each means, and which learner class runs it), its checks. Its `[name]`
    config section is a frozen dataclass deriving from this, in `rlfarm/algos/<name>/config.py`, and
    RunConfig's field `<name>` is typed with it (rlfarm.config.run)."""

    algo: ClassVar[str]
    modes: ClassVar[dict[str, str]]  # mode -> what running in it means, for `--help` and errors
    # mode -> "module:Class" of the learner that runs it, the module in the algorithm's package
    learners: ClassVar[dict[str, str]]
    mode_hint: ClassVar[str] = ""  # why the other modes are not supported
    # The modes whose learner learns a recurrent policy (policy.recurrent) over sequences; none: the
    # algorithm's policies are feed-forward.
    recurrent_modes: ClassVar[tuple[str, ...]] = ()

    def check(self, run: RunConfig) -> None:
        """Raise ConfigError for values that cannot make a run (the section's own and how they fit
        the rest of the run)."""

    @classmethod
    def check_mode(cls, mode: str) -> None:
        if mode not in cls.modes:
            raise ConfigError(
                f"algo {cls.algo!r} cannot run in --mode {mode} (supported: "
                f"{', '.join(cls.modes)})" + (f": {cls.mode_hint}" if cls.mode_hint else "")
            )

    @classmethod
    def check_spaces(cls, spec: SpaceSpec) -> None:
        """Raise ConfigError when the algorithm cannot act in an env with these spaces."""

    def learner_forwards(self, run: RunConfig) -> float | None:
        """What the learner spends per env step it consumes, in forwards of the network per observation
        (a forward-backward counts 3), for splitting a machine's cores between learner and workers
        (rlfarm.config.cores); None: not modelled, the cores are split evenly."""
        return None
