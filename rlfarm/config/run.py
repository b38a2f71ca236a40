"""Run configuration: `RunConfig`, a frozen dataclass of top-level keys and one frozen section per
TOML table (`[env]`, `[farm]`, `[policy]`, one per algorithm, `[async]`, `[eval]`).

Every field is declared here, the algorithms' sections too: each is its algorithm's own dataclass
(`rlfarm/algos/<name>/config.py`, light: no torch, standing on rlfarm.sections alone), imported by
name, so `cfg.ppo.clip_coef` is typed.
Those fields are the list of algorithms: `ALGORITHMS` is read from them and `rlfarm.algos` (the
registry callers use: sections, learners, names) reads `ALGORITHMS`. Beside this module: dotted keys
and run files' dicts (keys), the checks of a whole config (checks), presets and `--set` (load).
Everything here is pure: no Redis, no Celery, no torch, no files.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field

from rlfarm.algos.dqn.config import DQNConfig
from rlfarm.algos.ppo.config import PPOConfig
from rlfarm.algos.sac.config import SACConfig
from rlfarm.algos.td3.config import TD3Config
from rlfarm.config import length
from rlfarm.sections.algo import AlgoSection

MODES = ("sync", "async")
DEVICES = ("auto", "cpu", "cuda")
# farm.compress: rlfarm.core.codec.COMPRESS_CHOICES, repeated here so reading a config never imports the
# codec (and torch with it); tests/test_wire.py checks the two agree.
COMPRESS = ("auto", "none", "zstd")
POLICY_DTYPES = ("float32", "float16")  # farm.policy_dtype: rlfarm.core.codec.wire_state
REFERENCES = ("", "sb3", "cleanrl", "rllib")  # `reference`: Stable-Baselines3, CleanRL, RLlib's APPO, or none


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"  # gymnasium id, or "module:callable" returning an Env
    num_envs: int = 4  # sub-environments stepped together inside one rollout task
    # Preprocessing, done on the workers: "auto" is DeepMind's Atari preprocessing for ALE ids
    # (rlfarm.envs.atari) and none for the rest; "atari" | "none" force it. The keys below are Atari's.
    preprocess: str = "auto"
    frame_stack: int = 4  # frames stacked into one observation
    screen_size: int = 84  # frames resized to this square (DeepMind's 84; 42: RLlib's APPO on Pong)
    noop_max: int = 30  # up to this many no-op actions at an episode's start
    terminal_on_life_loss: bool = False  # a lost life ends the episode for learning (not the game)
    clip_rewards: bool = True  # learn from the sign of the reward; episode returns stay the game score
    # Multi-agent envs: which policy acts for which agents, "pattern=policy" entries (fnmatch patterns
    # of agent ids; the first that matches wins), e.g. ["adversary_*=adversary", "agent_*=agent"].
    # Empty: one policy shared by every agent (rlfarm.envs.agents, rlfarm.algos.group).
    policy_map: tuple[str, ...] = ()


@dataclass(frozen=True)
class FarmConfig:
    num_tasks: int = 4  # rollout tasks per SYNC iteration: fixed by the run, never by the worker count
    steps_per_env: int = 256  # env steps each sub-env takes in one task
    # Worker processes the embedded default starts; 0 ("auto"): half the machine's cores, at least 1
    # (local_workers), the split the Atari presets use: learner and actors then share the cores.
    workers: int = 2
    # A running task (one whose worker holds its lease) without a result this many seconds after it
    # started gets one backup copy; queued tasks are never late (see rlfarm.trainer.watchdog).
    task_timeout: float = 120.0
    max_redispatch: int = 3  # re-sends of one lost task after which the run fails instead of retrying
    keep_versions: int = 5  # policy versions retained in Redis
    lease_seconds: float = 10.0  # a running task's lease expiry: how soon a lost worker is noticed
    task_time_limit: float = 0.0  # hard limit on a task's run time on its worker; 0: 10x the longest seen
    redis_outage_timeout: float = 120.0  # seconds of Redis outage the trainer rides out before it stops
    max_result_bytes: int = 256 * 2**20  # a worker refuses to send a larger result (Redis caps at 512 MiB)
    # "fresh": every task starts its episodes anew (SYNC is bit-reproducible); "continue": each worker
    # process keeps its sub-envs running across tasks, so episodes may be longer than a task
    # (Atari, MuJoCo); not bit-reproducible (see rlfarm.core.rollout).
    episodes: str = "fresh"
    # Result arrays on the wire (rlfarm.core.codec): "auto" compresses large ones (zstd; Atari frame stacks
    # shrink by two orders of magnitude, benchmarks/wire.py), "zstd" pins that codec, "none" sends them
    # raw. max_result_bytes is the compressed size.
    compress: str = "auto"
    # This run's weight in the farm's task slots among the runs training on it at once (`--share W`):
    # slots are split in proportion to the weights of the runs that want them (rlfarm.core.shares).
    share: float = 1.0
    # Policy versions in Redis: "float32", or "float16" to halve what each fetch sends for large networks
    # (the Nature CNN: 6.75 MB -> 3.4). Workers act in float32 with the rounded weights; the learner,
    # its checkpoints and final_policy.safetensors keep float32 (tests/test_machine.py compares acting).
    policy_dtype: str = "float32"


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP layers (vector observations)
    activation: str = "tanh"  # tanh | relu
    init_log_std: float = 0.0  # Gaussian policies: initial log standard deviation
    # Image observations: a Nature-CNN encoder (Mnih et al. 2015). Images too small for these
    # kernels get a small 3x3 encoder instead (rlfarm.nn.layers.cnn_layers says which).
    cnn_channels: tuple[int, ...] = (32, 64, 64)
    cnn_kernels: tuple[int, ...] = (8, 4, 3)
    cnn_strides: tuple[int, ...] = (4, 2, 1)
    cnn_features: int = 512  # the encoder's output size (a linear layer after the convolutions)
    # How the CNN is built beyond its layers' sizes. The defaults are the Nature CNN as CleanRL and SB3
    # build it; RLlib's vision network (its APPO on Pong) is cnn_padding "same", cnn_linear false,
    # obs_scale 1 and init "xavier".
    cnn_padding: str = "valid"  # valid | same (TF's "same", every convolution but the last)
    cnn_linear: bool = True  # false: no linear layer after the convolutions; their flattened output is the features
    obs_scale: float = 255.0  # pixels are divided by this before the first convolution (1: raw 0-255 values)
    # orthogonal: PPO's implementation details (gain sqrt 2, heads 0.01 and 1); xavier: RLlib's
    # (Xavier-uniform convolutions and action head, the value head normc(0.01), zero biases)
    init: str = "orthogonal"
    # Vector observations: normalise by running mean and variance, kept in the network's state (so
    # every version carries the statistics it acts with) and updated by the learner (rlfarm.nn.normalize).
    normalize_obs: bool = False
    normalize_clip: float = 10.0  # normalised observations are clipped to [-clip, clip]
    # Memory: "lstm" or "gru" after the encoder (rlfarm.nn.recurrent): on the (normalised) vector, or on
    # an image's Nature CNN features (linear heads after it, as sb3-contrib's CnnLstmPolicy). Its state
    # carried by the actor from step to step, zeroed at episode starts and saved with the env stream;
    # "": none (feed-forward). docs/memory.md.
    recurrent: str = ""
    recurrent_size: int = 64  # the LSTM's or GRU's units
    # The critic has a core of its own beside the actor's (sb3-contrib's enable_critic_lstm): the value
    # loss's gradients then never reach the actor's memory. false: one core for both (CleanRL's).
    critic_core: bool = False
    # Steps of one learning sequence (truncated BPTT; each starts from the state its task recorded for
    # it): a divisor of farm.steps_per_env, so a sequence never crosses tasks. 0: a whole task.
    seq_len: int = 0
    # R2D2's burn-in: the first steps of each learning sequence only refresh its recorded state (from
    # the version that acted) with the learner's network and are left out of the loss. 0: none.
    burn_in: int = 0


@dataclass(frozen=True)
class AsyncConfig:
    tasks_in_flight: int = 0  # 0: one per online worker process (at least 2)
    # APPO: results per update (0: as many as tasks in flight); more could never be in flight at once.
    results_per_update: int = 0
    # Results acted with a version older than this many versions are dropped; 0 ("auto"): derived
    # from the tasks in flight (rlfarm.trainer.auto_policy_lag).
    max_policy_lag: int = 8
    publish_interval: int = 32  # gradient steps between published versions
    # A running task checks for a newer version every this many steps and acts with it from then on,
    # as IMPALA's actors do (0: a task acts with the version it started with throughout). With tasks
    # longer than an update, most steps then act with the newest version: APPO needed fewer env steps
    # and less time (benchmarks/appo.py, sleep-bound env).
    refresh_steps: int = 64
    # "inline": results are taken out of Redis and decoded by the trainer's main thread, between the
    # learner's steps; "thread" (default): by a thread beside the learner (rlfarm.trainer.ingest), so
    # a GPU learner's one Python thread never stops to decode (benchmarks/ingest.py --learner).
    ingest: str = "thread"


@dataclass(frozen=True)
class EvalConfig:
    interval: int = 0  # env steps between greedy evaluations (0: never)
    episodes: int = 10  # episodes per evaluation, split over `tasks` tasks
    tasks: int = 2
    # An evaluation at or above target_return is confirmed by this many more greedy episodes with
    # other seeds before the run counts the target as reached (0: the first evaluation decides).
    confirm_episodes: int = 20


@dataclass(frozen=True)
class SelfPlayConfig:
    """Turn-based games (rlfarm.envs.turns): who plays the seats the learner does not."""

    # "league": the policy's own versions (rlfarm.core.league); "random" or "lookahead" (connect four):
    # a scripted player (rlfarm.envs.opponents) in every game.
    opponents: str = "league"
    league_size: int = 8  # past versions the league keeps (the newest that joined)
    league_every: int = 5  # every this many published versions, the newest joins the league
    # The share of games against the version acting itself (the mirror match); the rest draw a
    # member of the league uniformly (all mirror matches while the league is empty).
    latest_share: float = 0.5
    # The share of games against a scripted player (`scripted`) beside the league: an exploiter's
    # curriculum (a policy that never meets one-move threats learns to block none).
    scripted_share: float = 0.0
    scripted: str = "lookahead"
    eval_opponent: str = "random"  # whom evaluation games are played against: "random" or "lookahead"


@dataclass(frozen=True)
class RunConfig:
    """One run's whole configuration: top-level keys, then one frozen section per table
    ([env], [farm], [policy], one per algorithm, [async], [eval], [selfplay])."""

    description: str = ""
    algo: str = "ppo"
    mode: str = "sync"
    seed: int = 1
    total_steps: int = 100_000
    target_return: float = math.inf  # stop early once the mean of the last 20 episodes reaches it
    # The implementation whose update this config's matches, "sb3" (Stable-Baselines3) or "cleanrl",
    # on the same batch and weights (tests/test_reference.py checks every shipped SYNC PPO preset that
    # way), or "rllib" (RLlib's APPO: tests/test_appo_reference.py); "" for none. It changes nothing
    # in a run: it says what the hyper-parameters may be compared to.
    reference: str = ""
    device: str = "auto"
    run_id: str = ""  # empty: generated at start
    logdir: str = "runs"
    # Trainer threads; 0 ("auto", rlfarm.config.cores): one for MLPs (fastest and reproducible at
    # their sizes), for CNNs what the learner's share of the cores is.
    torch_threads: int = 0
    # Trainer checkpoint (for --resume) at most every this many seconds, at a published version, and
    # at the end; 0: at every published version. Off-policy replay buffers are saved with it when
    # checkpoint_replay.
    checkpoint_interval: float = 10.0
    checkpoint_replay: bool = True
    # Policies of env.policy_map that are not trained: "policy=file" entries, each acting with a saved
    # policy file's weights throughout the run (a fixed opponent or a fixed lower level).
    frozen: tuple[str, ...] = ()
    # Keys of the run's algorithm section that differ for one policy of env.policy_map, "policy:key=value"
    # entries (`agent:ppo.learning_rate=1e-4`, the value as TOML reads it): that policy's learner
    # takes its own; the acting options and the publishing pace stay the run's (rlfarm.algos.group).
    policy_settings: tuple[str, ...] = ()
    env: EnvConfig = field(default_factory=EnvConfig)
    farm: FarmConfig = field(default_factory=FarmConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # One section per algorithm, the field named as the algorithm (`algo`): adding an algorithm adds
    # its line here (and its import above). Only the run's own is used, and written to run files.
    dqn: DQNConfig = field(default_factory=DQNConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)

    @property
    def algo_config(self) -> AlgoSection:
        """The section of this run's algorithm (cfg.ppo for algo "ppo")."""
        return getattr(self, ALGORITHMS[self.algo].algo)

    @property
    def steps_per_iteration(self) -> int:
        return self.farm.num_tasks * self.env.num_envs * self.farm.steps_per_env

    @property
    def num_iterations(self) -> int:
        return length.num_iterations(self)

    def task_steps(self, env_steps: int) -> int:
        """Steps per env of a SYNC iteration starting at `env_steps` (the last one's are fewer)."""
        return length.task_steps(self, env_steps)

    def rounding_note(self) -> str | None:
        return length.rounding_note(self)


def _algorithm_fields() -> dict[str, type[AlgoSection]]:
    """RunConfig's algorithm sections by field name, in field order (alphabetical)."""
    hints = typing.get_type_hints(RunConfig)
    return {name: tp for name, tp in hints.items() if isinstance(tp, type) and issubclass(tp, AlgoSection)}


# Every algorithm's section, by name: what a config can name (rlfarm.algos finds the learners from
# the same sections).
ALGORITHMS: dict[str, type[AlgoSection]] = _algorithm_fields()
