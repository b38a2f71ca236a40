"""Layers every algorithm builds its networks from (PURE: torch): orthogonally initialised MLPs, the
Nature CNN (Mnih et al. 2015) on uint8 images with the 1/255 folded into its first layer, and the
channels-last memory format the CPU computes convolutions fastest in.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.acting import action_scale_bias
from rlfarm.nn.normalize import ObsNormalizer

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    # Orthogonal init (as in the PPO implementation details) keeps early policies near-uniform.
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def normc_init(layer: nn.Module, std: float) -> nn.Module:
    """RLlib's normc initializer: each output unit's weights drawn from N(0, 1), then scaled to norm
    `std`; bias 0."""
    with torch.no_grad():
        weight = torch.randn_like(layer.weight)
        layer.weight.copy_(weight * (std / weight.flatten(1).norm(dim=1).reshape(-1, *[1] * (weight.dim() - 1))))
    nn.init.zeros_(layer.bias)
    return layer


def xavier_init(layer: nn.Module) -> nn.Module:
    """RLlib's default initializer of its convolutions (SlimConv2d): Xavier-uniform, bias 0."""
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
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


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TF's (and RLlib's) "same" padding of one side length: the output is ceil(size / stride), the
    padding its convolution needs split with the odd pixel after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def cnn_layers(spec: SpaceSpec, config: PolicyConfig) -> list[tuple[int, int, int]]:
    """(channels, kernel, stride) of each convolution for this image: the configured ones (Nature CNN
    by default) when the image is large enough for them, else SMALL_IMAGE_LAYERS (kernels capped
    at the image size)."""
    _, h, w = chw_shape(spec)
    configured = list(zip(config.cnn_channels, config.cnn_kernels, config.cnn_strides))
    size = min(h, w)
    for i, (_, kernel, stride) in enumerate(configured):
        if config.cnn_padding == "same" and i < len(configured) - 1:
            size = -(-size // stride)
        else:
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
    """A convolution on raw 0-255 pixels that sees them divided by `obs_scale` (255: [0, 1]): the
    scale is folded into its weights (a few thousand multiplications per call instead of one per
    input value, a pass over the batch that cost the learner as much as a layer: benchmarks/learner.py
    --profile)."""

    def __init__(self, *args, obs_scale: float = 255.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = 1.0 / obs_scale

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.scale == 1.0 else self.weight * self.scale
        return self._conv_forward(pixels, weight, self.bias)


class NatureCNN(nn.Module):
    """uint8 images -> features: convolutions with ReLU, then one linear layer with ReLU (or, with
    policy.cnn_linear false, the convolutions' flattened output: RLlib's vision network, whose last
    convolution covers the whole map left)."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        self.hwc = spec.image_layout == "HWC"
        c, h, w = chw_shape(spec)
        init = xavier_init if config.init == "xavier" else layer_init
        specs = cnn_layers(spec, config)
        layers: list[nn.Module] = []
        for i, (channels, kernel, stride) in enumerate(specs):
            if config.cnn_padding == "same" and i < len(specs) - 1:
                top, bottom = same_padding(h, kernel, stride)
                left, right = same_padding(w, kernel, stride)
                layers.append(nn.ZeroPad2d((left, right, top, bottom)))
                h, w = -(-h // stride), -(-w // stride)
            else:
                h, w = _conv_out(h, kernel, stride), _conv_out(w, kernel, stride)
            if i == 0:
                conv = PixelConv2d(c, channels, kernel, stride, obs_scale=config.obs_scale)
            else:
                conv = nn.Conv2d(c, channels, kernel, stride)
            layers += [init(conv), nn.ReLU()]
            c = channels
        layers.append(nn.Flatten())
        self.convs = nn.Sequential(*layers)
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *chw_shape(spec))).shape[1]
        if config.cnn_linear:
            self.linear = nn.Sequential(init(nn.Linear(flat, config.cnn_features)), nn.ReLU())
            self.features = config.cnn_features
        else:
            self.linear = nn.Identity()
            self.features = flat

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.permute(0, 3, 1, 2) if self.hwc else obs  # an HWC batch is already NHWC in memory
        if x.is_cpu:
            # oneDNN's convolutions are fastest on NHWC ("channels last") on CPU, forward and backward
            # (benchmarks/learner.py): reorder the uint8 pixels, a quarter of float32's bytes, once.
            x = x.contiguous(memory_format=torch.channels_last)
        # Pixels as the weights' floats (float32; a float64 copy computes in float64: tests/test_reference.py),
        # scaled to [0, 1] by the first layer (PixelConv2d).
        return self.linear(self.convs(x.to(self.convs[-3].weight.dtype)))


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


class BoundedPolicy(nn.Module):
    """What a policy of continuous actions in a Box's bounds shares (SAC's and TD3's): its unit actions
    in [-1, 1] (the scale of its tanh, its critics and its noises) and the env's bounds, and the
    normaliser of vector observations its critics see them through too (one set of statistics per run).
    A subclass builds its layers, then calls `_bounds`."""

    def _bounds(self, spec: SpaceSpec, config: PolicyConfig) -> None:
        self.obs_norm = obs_normalizer(spec, config)
        scale, bias = action_scale_bias(spec)
        # Not part of the saved weights: the bounds are the env's, read from its spec when built.
        self.register_buffer("action_scale", torch.as_tensor(scale, dtype=torch.float32), persistent=False)
        self.register_buffer("action_bias", torch.as_tensor(bias, dtype=torch.float32), persistent=False)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Vector observations as the networks see them (identity without policy.normalize_obs)."""
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        return self.action_bias + self.action_scale * unit

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions (as replayed) to [-1, 1], the scale the critics see them in."""
        return (action - self.action_bias) / self.action_scale
