"""Envs rlfarm ships, named `rlfarm/<module>` (`rlfarm/four_rooms`): a fixed package, so workers build
them without an allowlist, as they build gymnasium's registered ids (rlfarm.envs.agents.FAMILIES).
`masked_velocity` is no env: it is the wrapper `rlfarm/cartpole_no_vel` and `rlfarm/pendulum_no_vel` share."""
