"""Environments, PURE (gymnasium; no Redis, no Celery): making them (make), which untrusted ids a
worker may make (allowlist), their spaces as rlfarm sees them (spaces), Atari's preprocessing (atari).
This module is the layer's face: import from it.
"""

from rlfarm.envs.allowlist import (
    ALLOWED_MODULES_VAR,
    allowed_env_modules,
    allowed_modules_env,
    check_env_allowed,
    env_module,
    module_allowed,
    valid_module_name,
)
from rlfarm.envs.make import PREPROCESSING, episode_limit, make_env, make_vector_env, preprocessing
from rlfarm.envs.spaces import OBS_DTYPES, SpaceSpec, describe, space_spec
from rlfarm.errors import EnvError

__all__ = [
    "ALLOWED_MODULES_VAR",
    "OBS_DTYPES",
    "PREPROCESSING",
    "SpaceSpec",
    "allowed_env_modules",
    "allowed_modules_env",
    "check_env_allowed",
    "describe",
    "env_module",
    "episode_limit",
    "make_env",
    "make_vector_env",
    "module_allowed",
    "preprocessing",
    "space_spec",
    "valid_module_name",
]
