"""Networks chosen from an env's spaces, and the actors workers act with (PURE: torch and numpy only).

- Vector observations: MLPs (separate actor and critic, as in CleanRL's PPO).
- Image observations (uint8, HWC or CHW): a Nature-CNN encoder (Mnih et al. 2015) shared by the
  heads. Pixels are scaled to [0, 1] inside the network (by its first layer), so the learner and the
  workers see the same numbers and uint8 travels everywhere else.
- SAC (Box actions): a tanh-squashed Gaussian policy scaled to the env's bounds, and soft Q-networks
  on (observation, action) that only its learner runs.

Actors act on a worker. An MLP acts through a numpy snapshot of its weights (per-step torch dispatch
costs more than the math at these sizes); a CNN through a torch copy on the CPU. Both sample from a
numpy Generator, so a task is a pure function of (weights, env seeds, action seed).
"""

from __future__ import annotations

import copy
import io
import math
import os
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.normalize import ObsNormalizer

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
_NUMPY_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0)}


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    # Orthogonal init (as in the PPO implementation details) keeps early policies near-uniform.
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(sizes: list[int], activation: str, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers += [layer_init(nn.Linear(sizes[i], sizes[i + 1])), _ACTIVATIONS[activation]()]
    layers.append(layer_init(nn.Linear(sizes[-2], sizes[-1]), std=out_std))
    return nn.Sequential(*layers)


# ---- images ----------------------------------------------------------------------------------------

SMALL_IMAGE_LAYERS = ((16, 3, 1), (32, 3, 1))  # for images too small for the configured kernels


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


def cnn_layers(spec: SpaceSpec, config: PolicyConfig) -> list[tuple[int, int, int]]:
    """(channels, kernel, stride) of each convolution for this image: the configured ones (Nature CNN
    by default) when the image is large enough for them, else SMALL_IMAGE_LAYERS (kernels capped
    at the image size)."""
    _, h, w = chw_shape(spec)
    configured = list(zip(config.cnn_channels, config.cnn_kernels, config.cnn_strides))
    size = min(h, w)
    for _, kernel, stride in configured:
        size = _conv_out(size, kernel, stride) if size >= kernel else 0
    if size >= 1:
        return configured
    layers, size = [], min(h, w)
    for channels, kernel, stride in SMALL_IMAGE_LAYERS:
        kernel = min(kernel, size)
        layers.append((channels, kernel, stride))
        size = _conv_out(size, kernel, stride)
    return layers


def chw_shape(spec: SpaceSpec) -> tuple[int, int, int]:
    shape = spec.obs_shape
    return tuple(shape) if spec.image_layout == "CHW" else (shape[2], shape[0], shape[1])  # type: ignore[return-value]


class PixelConv2d(nn.Conv2d):
    """A convolution on raw 0-255 pixels that sees them scaled to [0, 1]: the 1/255 is folded into
    its weights (a few thousand multiplications per call instead of one per input value, a pass over
    the batch that cost the learner as much as a layer: benchmarks/learner.py --profile)."""

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(pixels, self.weight * (1.0 / 255.0), self.bias)


class NatureCNN(nn.Module):
    """uint8 images -> features: convolutions with ReLU, then one linear layer with ReLU."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        self.hwc = spec.image_layout == "HWC"
        c, h, w = chw_shape(spec)
        layers: list[nn.Module] = []
        for channels, kernel, stride in cnn_layers(spec, config):
            conv = PixelConv2d if not layers else nn.Conv2d
            layers += [layer_init(conv(c, channels, kernel, stride)), nn.ReLU()]
            c = channels
        layers.append(nn.Flatten())
        self.convs = nn.Sequential(*layers)
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *chw_shape(spec))).shape[1]
        self.linear = nn.Sequential(layer_init(nn.Linear(flat, config.cnn_features)), nn.ReLU())
        self.features = config.cnn_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.permute(0, 3, 1, 2) if self.hwc else obs  # an HWC batch is already NHWC in memory
        if x.is_cpu:
            # oneDNN's convolutions are fastest on NHWC ("channels last") on CPU, forward and backward
            # (benchmarks/learner.py): reorder the uint8 pixels, a quarter of float32's bytes, once.
            x = x.contiguous(memory_format=torch.channels_last)
        return self.linear(self.convs(x.float()))  # pixels scaled to [0, 1] by the first layer (PixelConv2d)


def place(network: nn.Module, device: torch.device) -> nn.Module:
    """`network` on `device`; on the CPU with its convolution weights in channels-last memory format,
    the layout oneDNN computes in (NatureCNN.forward), so no layer reorders its weights per call. An
    MLP has no 4-D weights and is only moved; on CUDA the layout is left as it was built."""
    network = network.to(device)
    return network.to(memory_format=torch.channels_last) if device.type == "cpu" else network


def pixel_layout(batch: torch.Tensor, spec: SpaceSpec) -> torch.Tensor:
    """A learner's batch of CHW images (N, C, H, W) on the CPU in channels-last memory, reordered once
    per update: minibatches indexed from it keep the layout, so NatureCNN.forward has nothing left to
    reorder. HWC images already are (the network permutes them to a channels-last view); anything
    else is returned as it is."""
    if spec.is_image and spec.image_layout == "CHW" and batch.is_cpu:
        return batch.contiguous(memory_format=torch.channels_last)
    return batch


# ---- networks --------------------------------------------------------------------------------------

def obs_normalizer(spec: SpaceSpec, config: PolicyConfig) -> ObsNormalizer | None:
    """A running-statistics normaliser for vector observations when `policy.normalize_obs` asks for
    one (images are scaled to [0, 1] instead)."""
    return ObsNormalizer(spec.obs_dim, config.normalize_clip) if config.normalize_obs and not spec.is_image else None


class ActorCritic(nn.Module):
    """Categorical or diagonal-Gaussian policy and a state value. Vectors: separate actor and critic
    MLPs. Images: one CNN encoder, a linear actor head and a linear critic head."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        self.spec = spec
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.critic = nn.Sequential(layer_init(nn.Linear(self.encoder.features, 1), std=1.0))
            self.actor = nn.Sequential(layer_init(nn.Linear(self.encoder.features, spec.action_dim), std=0.01))
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

    def _distribution(self, out: torch.Tensor) -> torch.distributions.Distribution:
        if self.spec.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        std = self.actor_logstd.expand_as(out).exp()
        return torch.distributions.Normal(out, std, validate_args=False)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        return self._distribution(self.actor(self._features(obs)))

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of `actions`, and the state value."""
        out, value = self._heads(obs)
        dist = self._distribution(out)
        if self.spec.discrete:
            logprob, entropy = dist.log_prob(actions.long()), dist.entropy()
        else:
            logprob, entropy = dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        return logprob, entropy, value

    def actor_snapshot(self) -> "PolicyActor":
        """A frozen copy for acting: numpy for MLPs; for a CNN, ONNX Runtime where it is installed
        (the `atari` extra), else torch on the CPU."""
        if self.encoder is None:
            return NumpyActor(self)
        graph = onnx_graph(self, _Heads(self), self.spec)
        return OnnxPolicyActor(self, graph) if graph is not None else TorchPolicyActor(self)


class QNetwork(nn.Module):
    """Action values for discrete actions: an MLP, or a CNN encoder and a linear head, to one Q per action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if not spec.discrete:
            raise ValueError("a Q-network needs a discrete action space")
        self.spec = spec
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.q = nn.Sequential(layer_init(nn.Linear(self.encoder.features, spec.action_dim), std=1.0))
        else:
            self.encoder = None
            self.q = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.encoder(obs) if self.encoder is not None else obs)

    def actor_snapshot(self) -> "QActor":
        return TorchQActor(self) if self.encoder is not None else NumpyQActor(self)


# SAC ----------------------------------------------------------------------------------------------------

# The Gaussian's log-std is squashed into this range by a tanh (as CleanRL does): smooth, where a clamp
# would cut the gradient off at the edges.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def action_scale_bias(spec: SpaceSpec) -> tuple[np.ndarray, np.ndarray]:
    """Half-range and midpoint of each action dimension (float64): env action = bias + scale * unit
    action, unit in [-1, 1]. Bounds may be asymmetric and differ per dimension."""
    low = np.asarray(spec.action_low, np.float64)
    high = np.asarray(spec.action_high, np.float64)
    return (high - low) / 2.0, (high + low) / 2.0


def log_std_from_tanh(t: Any) -> Any:
    """tanh of the log-std head's output (in [-1, 1]) -> the log-std, in [LOG_STD_MIN, LOG_STD_MAX]."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (t + 1.0)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2), elementwise, as 2 (log 2 - u - softplus(-2u)): the same identity, exact
    where 1 - tanh(u)^2 rounds to 0 in float32 (|u| > ~9) and needs no epsilon."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def np_tanh_log_det(u: np.ndarray) -> np.ndarray:
    """tanh_log_det in numpy (softplus(x) = logaddexp(0, x)), for the workers."""
    return 2.0 * (np.log(2.0) - u - np.logaddexp(0.0, -2.0 * u))


class SquashedGaussianPolicy(nn.Module):
    """SAC's policy: u ~ N(mean(s), std(s)) and the action a = bias + scale * tanh(u), in the env's
    bounds. `actor` is the mean's MLP (its last layer the mean head), `actor_logstd` a second head on
    the same features, so a saved policy reads like PPO's for rlfarm.policy.load_network (observation
    size from the first layer, action size from the last). Images: a CNN encoder, then both heads.

    Log-probabilities are of the unit action tanh(u) in [-1, 1] (as SB3's): the scaling to the bounds
    is a constant shift, left out so the target entropy -action_dim means the same for any bounds."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.discrete:
            raise ValueError("a squashed Gaussian policy needs a Box action space")
        self.spec = spec
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            features = self.encoder.features
            self.actor = nn.Sequential(layer_init(nn.Linear(features, spec.action_dim), std=0.01))
        else:
            self.encoder = None
            features = config.hidden_sizes[-1]
            self.actor = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=0.01)
        self.actor_logstd = layer_init(nn.Linear(features, spec.action_dim), std=0.01)
        # The statistics the critics see observations with too (rlfarm.algos.sac): one set per run.
        self.obs_norm = obs_normalizer(spec, config)
        scale, bias = action_scale_bias(spec)
        # Not part of the saved weights: the bounds are the env's, read from its spec when built.
        self.register_buffer("action_scale", torch.as_tensor(scale, dtype=torch.float32), persistent=False)
        self.register_buffer("action_bias", torch.as_tensor(bias, dtype=torch.float32), persistent=False)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log-std over pre-squash actions u."""
        h = self.encoder(obs) if self.encoder is not None else self.normalize(obs)
        h = self.actor[:-1](h)  # the shared hidden layers (none for images: the encoder's features)
        return self.actor[-1](h), log_std_from_tanh(torch.tanh(self.actor_logstd(h)))

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Vector observations as the networks see them (identity without policy.normalize_obs)."""
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised unit actions tanh(u) and their log-probabilities
        log N(u; mean, std) - sum log(1 - tanh(u)^2). Noise from `generator`: a learner's private
        stream, so a checkpoint can hold it."""
        mean, log_std = self(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise
        # (u - mean) / std is the noise itself: no division, no rounding.
        normal = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        return torch.tanh(u), (normal - tanh_log_det(u)).sum(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action in unit scale, tanh(mean)."""
        return torch.tanh(self(obs)[0])

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        return self.action_bias + self.action_scale * unit

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions (as replayed) to [-1, 1], the scale the critics see them in."""
        return (action - self.action_bias) / self.action_scale

    def actor_snapshot(self) -> "SACActor":
        return TorchSACActor(self) if self.encoder is not None else NumpySACActor(self)


class SoftQNetwork(nn.Module):
    """SAC's critic Q(s, a) for Box actions given in unit scale [-1, 1] (whatever the env's bounds, so
    wide or shifted bounds do not skew the input): an MLP on the observation, or on its CNN features,
    concatenated with the action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.discrete:
            raise ValueError("a soft Q-network takes Box actions")
        self.spec = spec
        self.encoder = NatureCNN(spec, config) if spec.is_image else None
        features = self.encoder.features if self.encoder is not None else spec.obs_dim
        self.q = mlp([features + spec.action_dim, *config.hidden_sizes, 1], config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        x = self.encoder(obs) if self.encoder is not None else obs
        return self.q(torch.cat([x, unit_action], -1)).squeeze(-1)


def build_policy(spec: SpaceSpec, config: PolicyConfig) -> ActorCritic:
    return ActorCritic(spec, config)


# ---- actors ------------------------------------------------------------------------------------------

def _numpy_mlp(seq: nn.Sequential) -> list[Any]:
    """A Linear/activation Sequential as numpy steps: (W^T, b) pairs and activation functions."""
    steps: list[Any] = []
    for m in seq:
        if isinstance(m, nn.Linear):
            steps.append((m.weight.detach().cpu().numpy().T.astype(np.float32).copy(),
                          m.bias.detach().cpu().numpy().astype(np.float32).copy()))
        else:
            steps.append(_NUMPY_ACTIVATIONS[type(m)])
    return steps


def _run_numpy_mlp(steps: list[Any], x: np.ndarray) -> np.ndarray:
    for step in steps:
        x = step(x) if callable(step) else x @ step[0] + step[1]
    return x


class Actor:
    """What `rollout.collect` and `rollout.run_episodes` act with: `act` and `value` on a batch of
    observations (shaped and typed as the spec says), and `with_options` for a task's acting options."""

    spec: SpaceSpec

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def value(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def with_options(self, **options: Any) -> "Actor":
        if options:
            raise ValueError(f"{type(self).__name__} takes no acting options, got {sorted(options)}")
        return self

    def _with(self, **attributes: Any) -> "Actor":
        """A shallow copy acting with other options: the weights are shared, not copied."""
        other = copy.copy(self)
        other.__dict__.update(attributes)
        return other


class PolicyActor(Actor):
    """Samples from the policy's distribution with a numpy generator; subclasses compute the outputs."""

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits or Gaussian means, state values) for a batch."""
        raise NotImplementedError

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._outputs(obs)[1]

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions (as stored: unclipped), their log-probabilities and state values, for a batch."""
        out, value = self._outputs(obs)
        out = out.astype(np.float64)
        if self.spec.discrete:
            logp = out - out.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            if deterministic:
                action = logp.argmax(-1)
            else:
                # Inverse-CDF sampling from the numpy generator.
                cdf = np.exp(logp).cumsum(-1)
                u = rng.random((len(cdf), 1)) * cdf[:, -1:]
                action = np.minimum((cdf < u).sum(-1), self.spec.action_dim - 1)
            logprob = logp[np.arange(len(action)), action].astype(np.float32)
            return action.astype(np.int64), logprob, value
        mean = out.astype(np.float32)
        if deterministic:
            action = mean
        else:
            action = (mean + self.std * rng.standard_normal(mean.shape)).astype(np.float32)
        z = (action - mean) / self.std
        logprob = (-0.5 * z * z - self.log_std - 0.5 * np.log(2 * np.pi)).sum(-1).astype(np.float32)
        return action, logprob, value

    def _gaussian(self, policy: ActorCritic) -> None:
        if not self.spec.discrete:
            self.log_std = policy.actor_logstd.detach().cpu().numpy().reshape(-1).astype(np.float32)
            self.std = np.exp(self.log_std)


class NumpyActor(PolicyActor):
    """Acts with a numpy snapshot of an MLP ActorCritic's weights (several times faster than torch
    for one small batch per env step)."""

    def __init__(self, policy: ActorCritic):
        self.spec = policy.spec
        self.actor = _numpy_mlp(policy.actor)
        self.critic = _numpy_mlp(policy.critic)
        self.normalize = policy.obs_norm.numpy() if policy.obs_norm is not None else None
        self._gaussian(policy)

    def value(self, obs: np.ndarray) -> np.ndarray:
        if self.normalize is not None:
            obs = self.normalize(obs)
        return _run_numpy_mlp(self.critic, obs)[:, 0]

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self.normalize(obs) if self.normalize is not None else obs
        return _run_numpy_mlp(self.actor, x), _run_numpy_mlp(self.critic, x)[:, 0]


class TorchPolicyActor(PolicyActor):
    """Acts with a CPU copy of a CNN ActorCritic (workers run one torch thread per process)."""

    def __init__(self, policy: ActorCritic):
        self.spec = policy.spec
        self.net = copy.deepcopy(policy).cpu().eval()
        self._gaussian(policy)

    @torch.no_grad()
    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, value = self.net._heads(torch.from_numpy(np.ascontiguousarray(obs)))
        return out.numpy(), value.numpy().astype(np.float32)


class OnnxPolicyActor(PolicyActor):
    """Acts with ONNX Runtime on the graph of a CNN ActorCritic's heads, loaded with this version's
    weights (one thread, as torch on a worker): about 1.8x torch's eager speed at a task's batch of 8
    Atari frames on one core (benchmarks/cnn_cpu.py)."""

    def __init__(self, policy: ActorCritic, graph: "OnnxGraph"):
        self.spec = policy.spec
        self.session = graph.session(policy.state_dict())
        self._gaussian(policy)

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, value = self.session.run(None, {"obs": np.ascontiguousarray(obs)})
        return out, value.astype(np.float32)


class QActor(Actor):
    """Greedy or epsilon-greedy acting from Q-values; subclasses compute them."""

    epsilon: float = 0.0

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def with_options(self, epsilon: float | None = None, **options: Any) -> "QActor":
        """The same weights acting with another exploration rate (no copy of the weights)."""
        super().with_options(**options)
        return self if epsilon is None else self._with(epsilon=float(epsilon))

    def with_epsilon(self, epsilon: float) -> "QActor":
        return self.with_options(epsilon=epsilon)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).max(-1).astype(np.float32)

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = self.q_values(obs)
        action = q.argmax(-1)
        if not deterministic and self.epsilon > 0:
            explore = rng.random(len(action)) < self.epsilon
            action = np.where(explore, rng.integers(0, self.spec.action_dim, len(action)), action)
        return action.astype(np.int64), np.zeros(len(action), np.float32), q.max(-1).astype(np.float32)


class NumpyQActor(QActor):
    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self.layers = _numpy_mlp(net.q)
        self.epsilon = epsilon

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return _run_numpy_mlp(self.layers, obs)


class TorchQActor(QActor):
    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self.net = copy.deepcopy(net).cpu().eval()
        self.epsilon = epsilon

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy()


class SACActor(Actor):
    """Acts with SAC's squashed Gaussian from a numpy generator: a = bias + scale * tanh(u),
    u ~ N(mean, std); greedy: bias + scale * tanh(mean). With the acting option `random` (heatup) it
    acts uniformly in the bounds without the network. Actions come back float32 and clipped to the
    bounds, so `collect`'s clip is a no-op and the rollout stores exactly what the env was given.
    Log-probabilities are of the unit action (see SquashedGaussianPolicy); values are 0 (SAC's
    critics are the learner's alone)."""

    random: bool = False

    def _bounds(self, spec: SpaceSpec) -> None:
        self.spec = spec
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self.scale, self.bias = action_scale_bias(spec)

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mean and log-std of u for a batch (float64)."""
        raise NotImplementedError

    def with_options(self, random: bool | None = None, **options: Any) -> "SACActor":
        """The same weights acting uniformly at random (heatup) or from the policy (no copy of the weights)."""
        super().with_options(**options)
        return self if random is None else self._with(random=bool(random))

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), np.float32)

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, dim = len(obs), self.spec.action_dim
        if self.random and not deterministic:
            action = rng.uniform(self.low, self.high, (n, dim))
            logprob = np.full(n, -dim * np.log(2.0))  # the uniform density on [-1, 1]^dim
        else:
            mean, log_std = self.gaussian(obs)
            noise = np.zeros_like(mean) if deterministic else rng.standard_normal(mean.shape)
            u = mean + np.exp(log_std) * noise
            logprob = (-0.5 * noise * noise - log_std - 0.5 * np.log(2 * np.pi) - np_tanh_log_det(u)).sum(-1)
            action = self.bias + self.scale * np.tanh(u)
        # float32 rounding may step a hair outside a bound: clip here, so what is stored is what is sent.
        action = np.clip(action.astype(np.float32), self.low, self.high)
        return action, logprob.astype(np.float32), np.zeros(n, np.float32)


class NumpySACActor(SACActor):
    """A numpy snapshot of an MLP SquashedGaussianPolicy (several times faster than torch per step)."""

    def __init__(self, policy: SquashedGaussianPolicy):
        self._bounds(policy.spec)
        steps = _numpy_mlp(policy.actor)
        self.hidden, self.mean_head = steps[:-1], steps[-1]
        (self.logstd_head,) = _numpy_mlp(nn.Sequential(policy.actor_logstd))
        self.normalize = policy.obs_norm.numpy() if policy.obs_norm is not None else None

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = _run_numpy_mlp(self.hidden, self.normalize(obs) if self.normalize is not None else obs)
        mean = h @ self.mean_head[0] + self.mean_head[1]
        log_std = log_std_from_tanh(np.tanh(h @ self.logstd_head[0] + self.logstd_head[1]))
        return mean.astype(np.float64), log_std.astype(np.float64)


class TorchSACActor(SACActor):
    """A CPU copy of a CNN SquashedGaussianPolicy (workers run one torch thread per process)."""

    def __init__(self, policy: SquashedGaussianPolicy):
        self._bounds(policy.spec)
        self.net = copy.deepcopy(policy).cpu().eval()

    @torch.no_grad()
    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, log_std = self.net(torch.from_numpy(np.ascontiguousarray(obs)))
        return mean.numpy().astype(np.float64), log_std.numpy().astype(np.float64)


# ---- ONNX Runtime for acting with CNNs -------------------------------------------------------------

# "auto": ONNX Runtime for CNN actors where onnx and onnxruntime import, else torch; "torch": always
# torch (the benchmarks compare the two). Read by each worker process from its environment.
ACTOR_RUNTIME_VARIABLE = "RLFARM_ACTOR_RUNTIME"


class _Heads(nn.Module):
    """ActorCritic._heads as a module's forward, the function exported for acting."""

    def __init__(self, policy: ActorCritic):
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy._heads(obs)


class OnnxGraph:
    """A network's acting function exported to ONNX once per network (on the worker, from rlfarm's
    own classes: no graph is ever read from Redis), then run by ONNX Runtime with each version's
    weights written into a fresh copy of the graph's initializers. Never into one kept copy: protobuf
    keeps what a message replaced until the message is freed, so writing each version into the same
    model grew a worker by the model's size per version (4 GB after 600 Pong versions;
    tests/test_policy.py checks it does not grow)."""

    def __init__(self, module: nn.Module, prefix: str, example: torch.Tensor):
        import onnx

        exported = copy.deepcopy(module).cpu().eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # distinct values: the exporter merges initializers that are equal (zero biases)
            for parameter in exported.parameters():
                parameter.normal_(generator=generator)
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
            # No constant folding: it would bake the first layer's 1/255 into a new, unnamed weight.
            torch.onnx.export(exported, (example,), buffer, input_names=["obs"], output_names=["out", "value"],
                              dynamic_axes={"obs": {0: "batch"}}, dynamo=False, do_constant_folding=False)
        self.model_bytes = buffer.getvalue()
        self.keys = {}
        for init in onnx.load_from_string(self.model_bytes).graph.initializer:
            if not init.name.startswith(prefix):
                raise ValueError(f"ONNX initializer {init.name!r} is not a weight of the network")
            self.keys[init.name] = init.name[len(prefix):]
        # Every weight the function uses must be an initializer of its own, to be replaced per version.
        used = {name for name, _ in exported.named_parameters() if name.startswith(prefix)}
        if used - set(self.keys):
            raise ValueError(f"weights folded into the ONNX graph: {sorted(used - set(self.keys))}")

    def session(self, state: dict[str, torch.Tensor]) -> Any:
        import onnx
        import onnxruntime
        from onnx import numpy_helper

        # A fresh copy of the exported model per version, dropped once serialised (see the class).
        model = onnx.load_from_string(self.model_bytes)
        for init in model.graph.initializer:
            array = state[self.keys[init.name]].detach().cpu().contiguous().numpy()
            init.CopyFrom(numpy_helper.from_array(array, init.name))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one core per worker process, as torch there
        options.inter_op_num_threads = 1
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnx_graph(network: nn.Module, module: nn.Module, spec: SpaceSpec) -> OnnxGraph | None:
    """The network's OnnxGraph, exported on first use and kept on the network (a worker loads every
    version into one network per run), or None where ONNX Runtime is not to be used: not installed,
    RLFARM_ACTOR_RUNTIME=torch, or a network the exporter cannot take."""
    cached = network.__dict__.get("_onnx_graph", False)
    if cached is not False:
        return cached
    graph = None
    if os.environ.get(ACTOR_RUNTIME_VARIABLE, "auto") != "torch" and _onnx_installed():
        example = torch.zeros((1, *spec.obs_shape), dtype=torch.uint8)
        try:
            graph = OnnxGraph(module, "policy.", example)
        except Exception:  # an exporter gap must not stop acting: torch acts instead
            graph = None
    network.__dict__["_onnx_graph"] = graph
    return graph


def _onnx_installed() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


# ---- saved policies ----------------------------------------------------------------------------------

class PolicyMismatch(ValueError):
    """Saved tensors that do not fit the network an env's spaces call for (another env's policy)."""


def _linear_shapes(state: dict[str, torch.Tensor], head: str) -> list[tuple[int, ...]]:
    """Shapes of the Linear weights of the `head` MLP (`actor`, `q`) in a state dict, in order."""
    found = []
    for key, tensor in state.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == head and parts[1].isdigit() and parts[2] == "weight":
            found.append((int(parts[1]), tuple(tensor.shape)))
    return [shape for _, shape in sorted(found)]


def _actions(discrete: bool, n: int) -> str:
    return f"{n} discrete action{'s' if n != 1 else ''}" if discrete else f"{n}-dimensional continuous actions"


def load_network(algo: str, spec: SpaceSpec, config: PolicyConfig,
                 state: dict[str, torch.Tensor]) -> nn.Module:
    """The network `algo` acts with, built for an env's `spec` and loaded with a saved `state`.
    Raises PolicyMismatch saying what does not fit (observation size, kind or number of actions)
    when the policy was trained on other spaces, or when its tensors are not the network its
    metadata describes."""
    from rlfarm.algos import learner
    from rlfarm.config import ALGORITHMS

    if algo not in ALGORITHMS:
        raise PolicyMismatch(f"unknown algorithm {algo!r} in its metadata ({', '.join(sorted(ALGORITHMS))})")
    cls = learner(algo)
    problems = []
    saved_image = any(key.startswith("encoder.") for key in state)
    if saved_image != spec.is_image:
        kinds = ("images", "vectors")
        problems.append(f"it takes {kinds[not saved_image]} as observations, the env gives {kinds[not spec.is_image]}")
    layers = _linear_shapes(state, cls.head)
    if layers and all(len(shape) == 2 for shape in layers):
        obs_dim, out = layers[0][1], layers[-1][0]
        # A Gaussian's log-std: PPO's parameter `actor_logstd`, SAC's head `actor_logstd.weight/bias`.
        discrete = not any(key.split(".")[0] == "actor_logstd" for key in state)
        if not saved_image and not spec.is_image and obs_dim != spec.obs_dim:
            problems.append(f"it takes observations of size {obs_dim}, the env's have size {spec.obs_dim}")
        if discrete != spec.discrete or out != spec.action_dim:
            problems.append(f"it acts with {_actions(discrete, out)}, the env takes "
                            f"{_actions(spec.discrete, spec.action_dim)}")
    if problems:
        raise PolicyMismatch("; ".join(problems))
    try:
        network = cls.build_network(spec, config)
        network.load_state_dict(state)
    except (RuntimeError, ValueError) as exc:  # tensors of another network (e.g. other hidden sizes)
        detail = " ".join(str(exc).split())
        detail = detail if len(detail) <= 400 else detail[:400] + " ..."
        raise PolicyMismatch(f"its tensors are not the {algo} network its metadata describes: {detail}") from None
    return network
