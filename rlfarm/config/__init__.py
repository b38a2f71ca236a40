"""Run configuration, PURE (no torch, no Redis): `RunConfig` and its sections (run), dotted keys and
run files' dicts (keys), the checks of a whole config (checks), presets and `--set` overrides (load,
`presets/`), what an algorithm's section is (section), how the cores are split between learner and
workers (cores), the upper bounds of every number that starts processes or allocates memory (bounds).
This module is the layer's face: import from it.
"""

from rlfarm.config.checks import check_agents, validate
from rlfarm.config.cores import (
    ACTING_FORWARDS,
    acting_share,
    local_workers,
    machine_cores,
    machine_memory,
    trainer_threads,
)
from rlfarm.config.keys import (
    AUTO_KEYS,
    flatten,
    for_policy,
    from_dict,
    from_flat,
    json_safe,
    policy_config,
    to_dict,
    valid_keys,
)
from rlfarm.config.load import build, load_preset, parse_override, preset_description, preset_names
from rlfarm.config.run import (
    ALGORITHMS,
    COMPRESS,
    DEVICES,
    MODES,
    AsyncConfig,
    EnvConfig,
    EvalConfig,
    FarmConfig,
    PolicyConfig,
    RunConfig,
)
from rlfarm.errors import ConfigError
from rlfarm.sections.algo import AlgoSection, at_least_1, check_replay, get
from rlfarm.sections.bounds import check_replay_memory

__all__ = [
    "for_policy",
    "ACTING_FORWARDS",
    "ALGORITHMS",
    "AUTO_KEYS",
    "COMPRESS",
    "DEVICES",
    "MODES",
    "AlgoSection",
    "AsyncConfig",
    "EnvConfig",
    "EvalConfig",
    "FarmConfig",
    "PolicyConfig",
    "RunConfig",
    "acting_share",
    "at_least_1",
    "build",
    "check_replay",
    "check_agents",
    "check_replay_memory",
    "flatten",
    "from_dict",
    "from_flat",
    "get",
    "json_safe",
    "load_preset",
    "local_workers",
    "machine_cores",
    "machine_memory",
    "parse_override",
    "policy_config",
    "preset_description",
    "preset_names",
    "to_dict",
    "trainer_threads",
    "valid_keys",
    "validate",
]
