"""Which env ids a worker may build from what it reads in Redis or a file (untrusted): ids registered
with gymnasium by installed packages, and "module:callable" / "module:EnvId" whose module is in
RLFARM_ALLOWED_ENV_MODULES (comma-separated; a name also allows its submodules). Imports nothing.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym

from rlfarm.errors import EnvError

ALLOWED_MODULES_VAR = "RLFARM_ALLOWED_ENV_MODULES"


def allowed_env_modules(environ: Any = None) -> tuple[str, ...]:
    """The module names in RLFARM_ALLOWED_ENV_MODULES (comma-separated, blanks ignored)."""
    raw = (os.environ if environ is None else environ).get(ALLOWED_MODULES_VAR, "")
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def valid_module_name(name: str) -> bool:
    """An absolute dotted module name (`a.b_c`), nothing relative, no path."""
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def env_module(env_id: str) -> str | None:
    """The module that a "module:callable" (or "module:EnvId") env id imports; None for a plain id."""
    module, sep, _ = env_id.partition(":")
    return module if sep and module else None


def allowed_modules_env(env_id: str, environ: Any = None) -> dict[str, str]:
    """{RLFARM_ALLOWED_ENV_MODULES: the current list plus the module of `env_id`}, for the environment
    of workers started for the user's own env (the embedded default); {} for a plain gymnasium id."""
    module = env_module(env_id)
    if module is None:
        return {}
    current = allowed_env_modules(environ)
    return {ALLOWED_MODULES_VAR: ",".join(current if module in current else (*current, module))}


def module_allowed(module_name: str, allowed: tuple[str, ...] | None = None) -> bool:
    allowed = allowed_env_modules() if allowed is None else allowed
    return valid_module_name(module_name) and any(
        module_name == name or module_name.startswith(name + ".") for name in allowed
    )


def is_pettingzoo_id(env_id: str) -> bool:
    """One of rlfarm.envs.agents' PettingZoo ids ("mpe2/simple_spread_v3"): fixed packages, allowed."""
    from rlfarm.envs.agents import pettingzoo_module

    return pettingzoo_module(env_id) is not None


def check_env_allowed(env_id: str, where: str = "on this worker", hint: str | None = None) -> None:
    """Raise EnvError unless an untrusted env id is a registered gymnasium id or names an allowed
    module. Imports nothing. A plain id that is not registered passes: making it fails ("unknown env")
    without importing anything."""
    if env_id in gym.registry or is_pettingzoo_id(env_id):
        return
    module = env_module(env_id)
    if module is None or module_allowed(module):
        return
    hint = hint or f"start the worker with --allow-env-module {module}"
    raise EnvError(
        f"env {env_id!r} is not allowed {where}: not a registered gymnasium id, and module "
        f"{module!r} is not in {ALLOWED_MODULES_VAR} ({hint})"
    )
