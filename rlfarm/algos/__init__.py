"""Algorithms: each turns gathered experience into parameter updates, with no I/O.

`learner(name)` is the registry: it returns the `Algorithm` class of an algorithm named in a config
(rlfarm.config.ALGORITHMS), importing its module `rlfarm.algos.<name>` on first use, so reading and
checking configs never imports torch. See rlfarm.algos.base for the interface.
"""

from __future__ import annotations

import importlib

from rlfarm.algos.base import _REGISTRY, Algorithm, register  # noqa: F401
from rlfarm.config import ALGORITHMS, ConfigError


def names() -> list[str]:
    return sorted(ALGORITHMS)


def learner(name: str, mode: str | None = None) -> type[Algorithm]:
    """The Algorithm class registered under `name` for `mode` (None: any of its learners; they share
    their networks and actors, which is all workers and `rlfarm eval` ask of them)."""
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algo {name!r}; available: {', '.join(names())}")
    modes = [mode] if mode is not None else list(ALGORITHMS[name].modes)
    for m in modes:
        if (name, m) not in _REGISTRY:
            importlib.import_module(f"rlfarm.algos.{_MODULES.get((name, m), name)}")
    for m in modes:
        if (name, m) in _REGISTRY:
            return _REGISTRY[(name, m)]
    ALGORITHMS[name].check_mode(str(mode))  # raises: the algorithm does not run in this mode
    raise ConfigError(f"no learner registered for algo {name!r} in mode {mode}")


# Learners that live in a module not named after their algorithm.
_MODULES = {("ppo", "async"): "appo"}


def check_mode(algo: str, mode: str) -> None:
    if algo not in ALGORITHMS:
        raise ConfigError(f"unknown algo {algo!r}; available: {', '.join(names())}")
    ALGORITHMS[algo].check_mode(mode)


def check_env(algo: str, spec) -> None:  # noqa: ANN001 - a SpaceSpec
    ALGORITHMS[algo].check_spaces(spec)


def algo_of_tensors(state) -> str:  # noqa: ANN001 - a state dict
    """The algorithm whose network a state dict holds, by its output module's tensors (policy files
    saved before policies named their algorithm); the first registered if none matches."""
    for name in names():
        if any(key.startswith(learner(name).head + ".") for key in state):
            return name
    return names()[0]
