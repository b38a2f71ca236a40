"""How long a run is: its SYNC iterations, the steps of the last one, and the note said before a run
whose total is not a whole number of iterations (RunConfig's `num_iterations`, `task_steps`,
`rounding_note` call these).

A run ends at total_steps. A SYNC run's last iteration runs the steps left, rounded up to a step of
every env of the iteration (at most num_tasks x num_envs - 1 over): whole iterations overran it
(sweep trials of 20,480 steps trained 24k and 32k) and gave trials of larger iterations more steps
than the others. An ASYNC run takes whole results until env_steps >= total_steps (at most one
task's steps over) and never rounds.
"""

from __future__ import annotations

from typing import Any


def num_iterations(cfg: Any) -> int:
    """SYNC iterations: the whole ones and, when total_steps is not a whole number of them, a shorter last one."""
    return max(1, -(-cfg.total_steps // cfg.steps_per_iteration))


def task_steps(cfg: Any, env_steps: int) -> int:
    """Steps per env of the tasks of a SYNC iteration that starts at `env_steps`: farm.steps_per_env,
    or fewer in the last one."""
    row = cfg.farm.num_tasks * cfg.env.num_envs  # every env of the iteration steps alike
    left = max(1, cfg.total_steps - env_steps)
    steps = -(-left // row)
    seq_len = cfg.policy.seq_len if cfg.policy.recurrent else 0
    if seq_len:  # a recurrent policy learns whole sequences (policy.seq_len divides farm.steps_per_env)
        steps = -(-steps // seq_len) * seq_len
    return min(cfg.farm.steps_per_env, steps)


def rounding_note(cfg: Any) -> str | None:
    """One line for the console when SYNC total_steps is not a whole number of iterations; None when
    every iteration is whole (and for ASYNC)."""
    per = cfg.steps_per_iteration
    if cfg.mode != "sync" or cfg.total_steps % per == 0:
        return None
    n, exact = num_iterations(cfg), cfg.total_steps / per
    shown = f"{exact:.2f}"
    if float(shown) in (n - 1, n):  # 0.001 or 9.9999 iterations: not "0.00" or "10.00"
        shown = f"{exact:.6g}"
    steps = task_steps(cfg, (n - 1) * per)
    last = steps * cfg.farm.num_tasks * cfg.env.num_envs
    note = (
        f"--total-steps {cfg.total_steps} is {shown} iterations of {per} steps: the last one runs "
        f"{steps} step{'s' if steps > 1 else ''} per env ({last:,} env steps)"
    )
    end = (n - 1) * per + last
    if end != cfg.total_steps:
        note += f", {end:,} env steps in all"
    return note
