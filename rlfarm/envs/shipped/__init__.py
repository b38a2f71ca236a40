"""Envs rlfarm ships, named `rlfarm/<module>` (`rlfarm/four_rooms`): a fixed package, so workers build
them without an allowlist, as they build gymnasium's registered ids (rlfarm.envs.agents.FAMILIES)."""
