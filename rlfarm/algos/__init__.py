"""Algorithms, PURE (torch and numpy; no I/O). Each package `rlfarm/algos/<name>/` is one algorithm:
its config section (`config.py`, light: no torch), its networks and the actors workers act with
(`policies.py`), its learner(s). Shared: the `Algorithm` interface (base), the off-policy machinery
DQN and SAC share (offpolicy), saved policies (saved).

This module is the registry callers use: `names()`, `section(name)`, `learner(name, mode)`. The
algorithms are declared once, as RunConfig's typed section fields (`ppo: PPOConfig`, in
rlfarm/config/run.py; nothing is found by scanning packages), and a section names the learner of each
mode it runs in (`learners = {"async": "td3:TD3"}`), which `learner()` imports on first use, so
reading and checking configs never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rlfarm.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from rlfarm.algos.base import Algorithm
    from rlfarm.config import PolicyConfig
    from rlfarm.envs import SpaceSpec
    from rlfarm.sections.algo import AlgoSection


def _sections() -> dict[str, type[AlgoSection]]:
    # Imported at first use: rlfarm.config imports this package's sections (config.py) while it loads.
    from rlfarm.config import ALGORITHMS

    return ALGORITHMS


def names() -> list[str]:
    return sorted(_sections())


def section(name: str) -> type[AlgoSection]:
    """The config section class of the algorithm `name` (ConfigError naming the known ones)."""
    sections = _sections()
    if name not in sections:
        raise ConfigError(f"unknown algo {name!r}; available: {', '.join(names())}")
    return sections[name]


def learner(name: str, mode: str | None = None) -> type[Algorithm]:
    """The Algorithm class that runs algorithm `name` in `mode` (None: any of its learners; they share
    their networks and actors, which is all workers and `rlfarm eval` ask of them)."""
    found = section(name)
    modes = [mode] if mode is not None else list(found.learners)
    for m in modes:
        if m in found.learners:
            module, _, cls = found.learners[m].partition(":")
            package = found.__module__.rpartition(".")[0]  # rlfarm.algos.<name>
            return getattr(importlib.import_module(f"{package}.{module}"), cls)
    found.check_mode(str(mode))  # raises: the algorithm does not run in this mode
    raise ConfigError(f"no learner declared for algo {name!r} in mode {mode}")


def network_for(algo: str, spec: SpaceSpec, config: PolicyConfig) -> nn.Module:
    """The network algorithm `algo` acts with for `spec`: its own, or one per policy where the env's
    agents are mapped to several (rlfarm.algos.group)."""
    cls = learner(algo)
    if spec.policies:
        from rlfarm.algos.group import GroupNetwork

        return GroupNetwork(spec, config, cls.build_network)
    return cls.build_network(spec, config)


def check_mode(algo: str, mode: str) -> None:
    section(algo).check_mode(mode)


def check_env(algo: str, spec: SpaceSpec) -> None:
    section(algo).check_spaces(spec)
