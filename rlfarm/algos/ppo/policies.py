"""PPO's network and the actors workers act with it (PURE: torch, numpy, ONNX Runtime).

`ActorCritic`: a categorical or diagonal-Gaussian policy and a state value. Vectors: separate actor
and critic MLPs (as CleanRL's PPO); images: one Nature-CNN encoder and a linear head each. Its
`actor` and `critic` are the network's heads (the saved tensors' names: `actor.0.weight`, ...).
Workers act with a numpy copy of an MLP, and with ONNX Runtime (else torch) for a CNN.
`RecurrentActorCritic` (policy.recurrent): an LSTM or GRU core on the observation (vectors) or on the
Nature CNN's features (images), then the two heads; acted in numpy (vectors), or with ONNX Runtime
(else torch) carrying the state (images).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from rlfarm.algos.ppo.acting import NumpyActor, PolicyActor, RecurrentNumpyActor, RecurrentPolicyActor
from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.errors import ConfigError
from rlfarm.nn.actors import OnnxGraph, numpy_state, onnx_graph
from rlfarm.nn.layers import NatureCNN, layer_init, mlp, normc_init, obs_normalizer, pixel_layout, xavier_init
from rlfarm.nn.recurrent import RecurrentCore


def policy_distribution(
    spec: SpaceSpec, out: torch.Tensor, log_std: torch.Tensor | None, mask: torch.Tensor | None = None
) -> torch.distributions.Distribution:
    """The policy's distribution of the actor head's `out`: categorical over logits, or a diagonal
    Gaussian around the means with the state-independent `log_std`."""
    if spec.discrete:
        if mask is not None:
            # Illegal actions (SpaceSpec.action_mask) get the lowest finite logit: probability 0, no
            # gradient, an entropy over the legal ones. Not -inf: a row with no legal action (an agent
            # out of its game, in APPO's targets) would be NaN.
            out = out.masked_fill(~mask, torch.finfo(out.dtype).min)
        return torch.distributions.Categorical(logits=out, validate_args=False)
    std = log_std.expand_as(out).exp()
    return torch.distributions.Normal(out, std, validate_args=False)


def log_prob_entropy(
    spec: SpaceSpec, dist: torch.distributions.Distribution, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of `actions` and the entropy, summed over a Box's dimensions."""
    if spec.discrete:
        return dist.log_prob(actions.long()), dist.entropy()
    return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)


class ActorCritic(nn.Module):
    """Categorical or diagonal-Gaussian policy and a state value. Vectors: separate actor and critic
    MLPs. Images: one CNN encoder, a linear actor head and a linear critic head."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        self.spec, self.config = spec, config
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.critic, self.actor = linear_heads(self.encoder.features, spec, config)
        else:
            self.encoder = None
            hidden = list(config.hidden_sizes)
            self.critic = mlp([spec.obs_dim, *hidden, 1], config.activation, out_std=1.0)
            self.actor = mlp([spec.obs_dim, *hidden, spec.action_dim], config.activation, out_std=0.01)
        self.obs_norm = obs_normalizer(spec, config)
        if not spec.discrete:
            self.actor_logstd = nn.Parameter(torch.full((1, spec.action_dim), config.init_log_std))

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.encoder is not None:
            return self.encoder(obs)
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def _heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._features(obs)
        return self.actor(x), self.critic(x).squeeze(-1)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(-1)

    def _distribution(self, out: torch.Tensor, mask: torch.Tensor | None = None) -> torch.distributions.Distribution:
        return policy_distribution(self.spec, out, None if self.spec.discrete else self.actor_logstd, mask)

    def distribution(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.distributions.Distribution:
        return self._distribution(self.actor(self._features(obs)), mask)

    def evaluate(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        mask: torch.Tensor | None = None,
        autocast: torch.dtype | None = None,
        layers: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of `actions`, and the state value. `mask` (batch, action_dim)
        bool: the legal actions, the only ones the distribution spreads over (None: all are).
        `autocast` (torch.bfloat16): the layers run under torch.autocast in that dtype, and their
        outputs come back to float32 before the distribution, so log-probabilities keep their precision.
        `layers`: `_heads` compiled (ppo.compile), the learner's own."""
        heads = layers if layers is not None else self._heads
        if autocast is None:
            out, value = heads(obs)
        else:
            with torch.autocast(obs.device.type, dtype=autocast):
                out, value = heads(obs)
            out, value = out.float(), value.float()
        logprob, entropy = log_prob_entropy(self.spec, self._distribution(out, mask), actions)
        return logprob, entropy, value

    def actor_snapshot(self) -> PolicyActor:
        """A frozen copy for acting: numpy for MLPs; for a CNN, ONNX Runtime where it is installed
        (the `atari` extra), else torch on the CPU."""
        if self.encoder is None:
            return NumpyActor(self.spec, self.config, numpy_state(self))
        graph = onnx_graph(self, _Heads(self), self.spec)
        return OnnxPolicyActor(self, graph) if graph is not None else TorchPolicyActor(self)


def linear_heads(features: int, spec: SpaceSpec, config: PolicyConfig) -> tuple[nn.Sequential, nn.Sequential]:
    """An image policy's critic and actor heads: one linear layer each on `features` (the CNN's, or the
    core's after it)."""
    critic, actor = nn.Linear(features, 1), nn.Linear(features, spec.action_dim)
    if config.init == "xavier":  # RLlib's vision network: its logits a 1x1 convolution, its value normc(0.01)
        critic, actor = normc_init(critic, 0.01), xavier_init(actor)
    else:
        critic, actor = layer_init(critic, std=1.0), layer_init(actor, std=0.01)
    return nn.Sequential(critic), nn.Sequential(actor)


class TorchPolicyActor(PolicyActor):
    """Acts with a CPU copy of a CNN ActorCritic (workers run one torch thread per process)."""

    def __init__(self, policy: ActorCritic):
        self.spec = policy.spec
        self.net = copy.deepcopy(policy).cpu().eval()
        self._gaussian(None if policy.spec.discrete else policy.actor_logstd.detach().cpu().numpy())

    @torch.no_grad()
    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, value = self.net._heads(torch.from_numpy(np.ascontiguousarray(obs)))
        return out.numpy(), value.numpy().astype(np.float32)


class OnnxPolicyActor(PolicyActor):
    """Acts with ONNX Runtime on the graph of a CNN ActorCritic's heads, loaded with this version's
    weights (one thread, as torch on a worker): faster than torch eager at a task's batch of 8
    Atari frames on one core (benchmarks/cnn_cpu.py)."""

    def __init__(self, policy: ActorCritic, graph: OnnxGraph):
        self.spec = policy.spec
        self.session = graph.session(policy.state_dict())
        self._gaussian(None if policy.spec.discrete else policy.actor_logstd.detach().cpu().numpy())

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, value = self.session.run(None, {"obs": np.ascontiguousarray(obs)})
        return out, value.astype(np.float32)


class _Heads(nn.Module):
    """ActorCritic._heads as a module's forward, the function exported for acting."""

    def __init__(self, policy: ActorCritic):
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy._heads(obs)


class RecurrentActorCritic(nn.Module):
    """ActorCritic with memory (policy.recurrent): an LSTM or GRU (`memory`, policy.recurrent_size) on the
    (normalised) observation, and on its output ActorCritic's actor and critic MLPs (policy.hidden_sizes),
    as sb3-contrib's MlpLstmPolicy builds them: one core for both heads, as CleanRL's LSTM PPO, or with
    policy.critic_core a second one for the critic (`critic_memory`, sb3-contrib's enable_critic_lstm),
    the state then both cores' side by side. Acted one step at a time from a state the actor carries
    (RecurrentNumpyActor); learned over sequences from the state each one started from
    (`evaluate_sequences`).

    Images: ActorCritic's Nature CNN (`encoder`, built and initialised as there) feeds the core(s), and
    a linear actor head and a linear critic head follow, as sb3-contrib's CnnLstmPolicy builds it (its
    net_arch is empty with a NatureCNN: the action and value layers sit right on the LSTM's output;
    policy.hidden_sizes is unused, as in ActorCritic's image branch). One encoder for both cores, as
    sb3-contrib's shared features extractor. Acted with ONNX Runtime, else torch (`actor_snapshot`)."""

    recurrent = True

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.policies:
            raise ConfigError(
                "policy.recurrent acts for one policy; several policies (env.policy_map) are not built yet"
            )
        self.spec, self.config = spec, config
        size, hidden = config.recurrent_size, list(config.hidden_sizes)
        self.encoder = NatureCNN(spec, config) if spec.is_image else None
        inputs = spec.obs_dim if self.encoder is None else self.encoder.features
        self.memory = RecurrentCore(config.recurrent, inputs, size)
        self.critic_memory = RecurrentCore(config.recurrent, inputs, size) if config.critic_core else None
        for core in (self.memory, self.critic_memory):  # as CleanRL's LSTM PPO: orthogonal, zero biases
            for name, param in core.named_parameters() if core is not None else ():
                nn.init.constant_(param, 0.0) if "bias" in name else nn.init.orthogonal_(param, 1.0)
        if self.encoder is not None:
            self.critic, self.actor = linear_heads(size, spec, config)
        else:
            self.actor = mlp([size, *hidden, spec.action_dim], config.activation, out_std=0.01)
            self.critic = mlp([size, *hidden, 1], config.activation, out_std=1.0)
        self.obs_norm = obs_normalizer(spec, config)
        if not spec.discrete:
            self.actor_logstd = nn.Parameter(torch.full((1, spec.action_dim), config.init_log_std))

    @property
    def state_size(self) -> int:
        return self.memory.state_size * (2 if self.critic_memory is not None else 1)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.encoder is not None:
            return self.encoder(obs)
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on a batch: the actor head's output, the state value and the next state."""
        x, width = self._features(obs), self.memory.state_size
        out, mine = self.memory.step(x, state[:, :width])
        if self.critic_memory is None:
            return self.actor(out), self.critic(out).squeeze(-1), mine
        valued, theirs = self.critic_memory.step(x, state[:, width:])
        return self.actor(out), self.critic(valued).squeeze(-1), torch.cat([mine, theirs], dim=1)

    def evaluate_sequences(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        starts: np.ndarray,
        state: torch.Tensor,
        mask: torch.Tensor | None = None,
        burn_in: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of `actions`, entropies and state values, flat (L x B), of B sequences of
        L steps: `obs` (L, B, obs_dim) or (L, B, *image shape) uint8, `actions` (L, B, ...), `starts`
        (L, B) bool, numpy, where an episode starts, `state` (B, state_size) the state each sequence
        started from, `mask` (L x B, A). Images go to the encoder as one (L x B) batch in the layout it
        computes in (pixel_layout: channels-last on the CPU, reordered here once per minibatch).
        `burn_in`: the first steps refresh the state without gradient (RecurrentCore.sequence)."""
        steps, batch = obs.shape[:2]
        if self.encoder is not None:
            flat = pixel_layout(obs.reshape(steps * batch, *obs.shape[2:]), self.spec)
        else:
            flat = obs.reshape(steps * batch, -1)
        features = self._features(flat).reshape(steps, batch, -1)
        width = self.memory.state_size
        out = self.memory.sequence(features, starts, state[:, :width], burn_in).reshape(steps * batch, -1)
        valued = out
        if self.critic_memory is not None:
            valued = self.critic_memory.sequence(features, starts, state[:, width:], burn_in)
            valued = valued.reshape(steps * batch, -1)
        flat_actions = actions.reshape(steps * batch, *actions.shape[2:])
        log_std = None if self.spec.discrete else self.actor_logstd
        dist = policy_distribution(self.spec, self.actor(out), log_std, mask)
        logprob, entropy = log_prob_entropy(self.spec, dist, flat_actions)
        return logprob, entropy, self.critic(valued).squeeze(-1)

    def actor_snapshot(self) -> PolicyActor:
        """A frozen copy for acting that carries the state: numpy for vectors; for images, ONNX Runtime
        where it is installed (the `atari` extra), else torch on the CPU, as ActorCritic's."""
        if self.encoder is None:
            return RecurrentNumpyActor(self.spec, self.config, numpy_state(self))
        graph = onnx_graph(self, _Step(self), self.spec, self.state_size)
        return OnnxRecurrentActor(self, graph) if graph is not None else TorchRecurrentActor(self)


class TorchRecurrentActor(RecurrentPolicyActor):
    """Acts with a CPU copy of an image RecurrentActorCritic, its `step` from the state it carries."""

    def __init__(self, policy: RecurrentActorCritic):
        self.spec = policy.spec
        self.net = copy.deepcopy(policy).cpu().eval()
        self._gaussian(None if policy.spec.discrete else policy.actor_logstd.detach().cpu().numpy())
        self._carry(policy.config.seq_len, policy.state_size)

    @torch.no_grad()
    def _step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, h = torch.from_numpy(np.ascontiguousarray(obs)), torch.from_numpy(np.ascontiguousarray(state, np.float32))
        out, value, after = self.net.step(x, h)
        return out.numpy(), value.numpy().astype(np.float32), after.numpy()


class OnnxRecurrentActor(RecurrentPolicyActor):
    """Acts with ONNX Runtime on the graph of an image RecurrentActorCritic's `step`, (obs, state) ->
    (actor out, value, next state), loaded with this version's weights (OnnxGraph)."""

    def __init__(self, policy: RecurrentActorCritic, graph: OnnxGraph):
        self.spec = policy.spec
        self.session = graph.session(policy.state_dict())
        self._gaussian(None if policy.spec.discrete else policy.actor_logstd.detach().cpu().numpy())
        self._carry(policy.config.seq_len, policy.state_size)

    def _step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feed = {"obs": np.ascontiguousarray(obs), "state": np.ascontiguousarray(state, np.float32)}
        out, value, after = self.session.run(None, feed)
        return out, value.astype(np.float32), after


class _Step(nn.Module):
    """RecurrentActorCritic.step as a module's forward, the function exported for acting."""

    def __init__(self, policy: RecurrentActorCritic):
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.policy.step(obs, state)
