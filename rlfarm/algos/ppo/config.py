"""[ppo]: PPO's config section (light: no torch), the learners it runs with, its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rlfarm.errors import ConfigError
from rlfarm.sections.algo import AlgoSection, at_least_1, check_replay  # noqa: F401
from rlfarm.sections.bounds import MAX_BUFFER_BATCHES, MAX_PASSES, at_most, check_learning_rate

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig


# ppo.vf_loss: the value loss's factor on mean((V - R)^2), by name (rlfarm.algos.ppo.ppo reads it).
VF_LOSSES = {"half_mse": 0.5, "mse": 1.0}
PRECISIONS = ("fp32", "bf16")  # ppo.precision
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")  # ppo.compile


@dataclass(frozen=True)
class PPOConfig(AlgoSection):
    """[ppo]: PPO with the clipped surrogate objective (rlfarm.algos.ppo.ppo; ASYNC: rlfarm.algos.ppo.appo)."""

    algo: ClassVar[str] = "ppo"
    modes: ClassVar[dict[str, str]] = {
        "sync": "each iteration waits for all its tasks, acted with one version",
        "async": "APPO: results are used as they come, corrected for policy lag with V-trace",
    }
    learners: ClassVar[dict[str, str]] = {"sync": "ppo:PPO", "async": "appo:APPO"}
    recurrent_modes: ClassVar[tuple[str, ...]] = ("sync", "async")  # PPO and APPO over sequences

    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 4
    num_minibatches: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    # The surrogate's clip range falls linearly to 0 over the run, with anneal_lr's progress (SB3's
    # `lin_X` schedule, rl-baselines3-zoo's Atari `clip_range: lin_0.1`); clip_vloss keeps clip_coef.
    anneal_clip: bool = False
    anneal_ent: bool = False  # the entropy bonus falls linearly to 0 likewise (RLlib's APPO on Pong)
    clip_vloss: bool = True
    # The value loss's form: "half_mse" 0.5 * mean((V - R)^2) (CleanRL) or "mse" mean((V - R)^2)
    # (Stable-Baselines3, so rl-baselines3-zoo); with clip_vloss the max of clipped and unclipped either way.
    vf_loss: str = "half_mse"
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float = 0.0  # stop the epoch loop early above this approx-KL; 0 disables
    # ASYNC (APPO) only: V-trace's truncation of the importance weights pi/mu (Espeholt et al. 2018).
    rho_bar: float = 1.0  # of the weights on the TD errors and advantages
    c_bar: float = 1.0  # of the trace-cutting weights
    vtrace: bool = True  # false: take lagged results as on-policy (GAE), for ablations
    pg_loss: str = "clip"  # clip: PPO's clipped surrogate; impala: -log pi(a) * advantage
    # ASYNC only: what the surrogate's ratio is clipped around. "behaviour": the policy that acted (APPO);
    # "proximal": the network as the update begins (Hilton et al. 2021's decoupled PPO), so a lagged
    # result keeps PPO's full trust region and V-trace's truncated weights pi/mu do the correction.
    # "target" (RLlib's APPO): around a target network, a copy of the network taken as each new batch
    # comes in (every `target_update_batches` batches), which is also V-trace's target policy; the
    # ratio is min(is_ratio_clip, mu/pi_target) * pi/mu, clipped at 1 +- clip_coef.
    clip_to: str = "behaviour"
    target_update_batches: int = 1
    is_ratio_clip: float = 2.0
    adam_eps: float = 1e-5  # Adam's epsilon (PPO's implementation details; torch's and RLlib's default: 1e-8)
    # ASYNC only: a circular buffer of the last `buffer_batches` batches, each learned from in
    # `batch_passes` updates, round robin, before it leaves (RLlib's circular_buffer_num_batches and
    # circular_buffer_iterations_per_batch, with which its APPO solves Pong). 1 and 1: each batch once.
    buffer_batches: int = 1
    batch_passes: int = 1
    # The learner's forward passes: "fp32", or "bf16" under torch.autocast (matmuls and convolutions
    # in bfloat16, the loss in float32; no loss scaling needed, unlike fp16). For CUDA cards with bf16
    # tensor cores (benchmarks/learner.py --precision); it works on CPUs too, mostly slower there.
    precision: str = "fp32"
    # The network's layers in the learner's minibatches under torch.compile in this mode ("none":
    # eager). On CPU it gains little for a CNN (benchmarks/learner.py --compile); it is meant for GPUs,
    # where kernel launches dominate at Pong's sizes and "reduce-overhead" adds CUDA graphs. It costs
    # seconds of compiling at the first update and needs a C compiler (and Triton on CUDA).
    compile: str = "none"

    def check(self, run: RunConfig) -> None:
        at_least_1(run, "ppo.update_epochs", "ppo.num_minibatches", "ppo.buffer_batches", "ppo.batch_passes")
        check_learning_rate(run, "ppo.learning_rate")
        at_most(run, "ppo.buffer_batches", MAX_BUFFER_BATCHES)
        at_most(run, "ppo.update_epochs", MAX_PASSES)
        at_most(run, "ppo.batch_passes", MAX_PASSES)
        if run.mode == "sync" and (self.buffer_batches, self.batch_passes) != (1, 1):
            raise ConfigError(
                "ppo.buffer_batches and ppo.batch_passes are ASYNC (APPO) settings: SYNC PPO "
                "learns each iteration's batch in ppo.update_epochs epochs"
            )
        if run.mode == "async":  # an update is a batch of whole results
            per_task = run.env.num_envs * run.farm.steps_per_env
            if per_task % self.num_minibatches:
                raise ConfigError(
                    f"ppo.num_minibatches ({self.num_minibatches}) must divide the steps of one task "
                    f"({per_task} = env.num_envs x farm.steps_per_env)"
                )
        else:
            batch = run.steps_per_iteration
            if batch % self.num_minibatches:
                raise ConfigError(
                    f"ppo.num_minibatches ({self.num_minibatches}) must divide the steps per iteration "
                    f"({batch} = farm.num_tasks x env.num_envs x farm.steps_per_env)"
                )
        for key in ("rho_bar", "c_bar"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"ppo.{key} must be positive, got {getattr(self, key)}")
        if self.pg_loss not in ("clip", "impala"):
            raise ConfigError(f"ppo.pg_loss must be clip or impala, got {self.pg_loss!r}")
        if self.vf_loss not in VF_LOSSES:
            raise ConfigError(
                f"ppo.vf_loss must be half_mse (CleanRL: 0.5 * mean((V - R)^2)) or mse "
                f"(Stable-Baselines3: mean((V - R)^2)), got {self.vf_loss!r}"
            )
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"ppo.compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"ppo.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.clip_to not in ("behaviour", "proximal", "target"):
            raise ConfigError(f"ppo.clip_to must be behaviour, proximal or target, got {self.clip_to!r}")
        if self.clip_to == "target" and run.mode != "async":
            raise ConfigError(
                "ppo.clip_to = target is an ASYNC (APPO) setting: SYNC PPO clips around the acting policy"
            )
        at_least_1(run, "ppo.target_update_batches")
        for key in ("is_ratio_clip", "adam_eps"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"ppo.{key} must be positive, got {getattr(self, key)}")

    def learner_forwards(self, run: RunConfig) -> float | None:
        # Each epoch is a forward-backward per sample; in ASYNC, V-trace's targets take one more forward
        # over the batch first, except in APPO's one pass (rlfarm.algos.ppo.appo), where the loss's
        # forward gives them (SYNC learns from the values the workers computed).
        targets = run.mode == "async" and not (self.update_epochs == 1 and self.vtrace)
        target_net = 1.0 if run.mode == "async" and self.clip_to == "target" else 0.0  # its forward per pass
        return (3.0 * self.update_epochs + (1.0 if targets else 0.0) + target_net) * self.batch_passes
