"""Algorithms: each turns gathered experience into parameter updates, with no I/O."""

from __future__ import annotations

from rlfarm.config import ConfigError

ALGOS: dict[str, tuple[str, ...]] = {
    # name -> modes it can run in. PPO is on-policy: ASYNC results acted with older versions would
    # need an off-policy correction (V-trace, IMPACT), which rlfarm does not implement.
    "ppo": ("sync",),
    "dqn": ("async",),
}


def check_mode(algo: str, mode: str) -> None:
    if algo not in ALGOS:
        raise ConfigError(f"unknown algo {algo!r}; available: {', '.join(sorted(ALGOS))}")
    if mode not in ALGOS[algo]:
        raise ConfigError(f"algo {algo!r} cannot run in --mode {mode} (supported: "
                          f"{', '.join(ALGOS[algo])})" + (
                              ": it is on-policy, and ASYNC results act with older policy versions"
                              if algo == "ppo" else ""))


def check_env(algo: str, discrete_actions: bool) -> None:
    if algo == "dqn" and not discrete_actions:
        raise ConfigError("algo 'dqn' needs a discrete action space; use ppo for continuous actions")
