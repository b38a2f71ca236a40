"""The Nature CNN on CPU: which way of running it is fastest, for the learner and for the actors.
Variants are timed in alternating rounds in one process (median of rounds), so a machine whose speed
drifts (shared cores) shifts them all alike; every figure is also a fraction of the machine's
attainable FLOP rate (a 2048x2048 float32 matmul on the same threads).

    pip install -e ".[atari]"
    python benchmarks/cnn_cpu.py                 # learner on 1 and all threads, actor on 1 thread
    python benchmarks/cnn_cpu.py --no-compile    # without torch.compile (its compile time is printed)

Learner (forward + backward + Adam on a minibatch of 256 uint8 4x84x84 frames):
  nchw             the network on NCHW float input scaled by a division (rlfarm before issue 20)
  channels_last    the same, weights and input in channels-last memory (oneDNN's layout)
  rlfarm           rlfarm's NatureCNN as shipped: channels-last, uint8 reordered before the float
                   conversion, the 1/255 folded into the first layer (rlfarm.nn.layers.PixelConv2d)
  compile          torch.compile of `rlfarm` (inductor, CPU)
Actor (one forward of a task's batch, 8 frames by default, one thread as on a worker):
  torch no_grad, torch inference_mode, channels_last, torch.compile, and ONNX Runtime on the graph
  rlfarm's workers export (rlfarm.algos.ppo.policies.OnnxPolicyActor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pong import layer_flops, matmul_gflops  # noqa: E402 - the same FLOP count and attainable rate as pong.py


def spec():
    from rlfarm.envs import SpaceSpec

    return SpaceSpec(4 * 84 * 84, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8")


def rounds(variants: dict[str, Callable[[], None]], repeats: int, n_rounds: int = 6) -> dict[str, float]:
    """Median seconds per call of each variant, timed in alternating rounds."""
    for fn in variants.values():  # warm-up (and compilation)
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n_rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[name].append((time.perf_counter() - t) / repeats)
    return {name: statistics.median(ts) for name, ts in times.items()}


def flops_per_obs() -> tuple[float, float]:
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig

    return layer_flops(ActorCritic(spec(), PolicyConfig()), torch.zeros((1, 4, 84, 84), dtype=torch.uint8))


def learner_variants(batch: int, compile_: bool) -> dict[str, Callable[[], None]]:
    import torch
    from torch import nn

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.nn.layers import pixel_layout, place

    frames = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 6, (batch,))

    def plain(channels_last: bool):
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Conv2d(4, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, 7),
        )
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        opt = torch.optim.Adam(net.parameters(), fused=True)

        def step() -> None:
            x = frames.float() / 255.0
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out = net(x)
            loss = out[:, :6].logsumexp(-1).mean() + out[:, 6].square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

        return step

    def shipped(compiled: bool):
        torch.manual_seed(0)
        net = place(ActorCritic(spec(), PolicyConfig()), torch.device("cpu"))
        opt = torch.optim.Adam(net.parameters(), fused=True)
        evaluate = torch.compile(net.evaluate) if compiled else net.evaluate
        batch_frames = pixel_layout(frames, spec())

        def step() -> None:
            logprob, entropy, value = evaluate(batch_frames, actions)
            loss = -logprob.mean() - 0.01 * entropy.mean() + value.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

        return step

    variants = {"nchw": plain(False), "channels_last": plain(True), "rlfarm": shipped(False)}
    if compile_:
        t = time.perf_counter()
        variants["compile"] = shipped(True)
        variants["compile"]()  # compiles here: timed apart
        print(f"  torch.compile of the learner's step: {time.perf_counter() - t:.1f} s to compile")
    return variants


def actor_variants(batch: int, compile_: bool) -> dict[str, Callable[[], None]]:
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic, OnnxPolicyActor, TorchPolicyActor, _Heads
    from rlfarm.config import PolicyConfig
    from rlfarm.nn.actors import onnx_graph

    torch.manual_seed(0)
    net = ActorCritic(spec(), PolicyConfig()).eval()
    obs = np.random.default_rng(0).integers(0, 256, (batch, 4, 84, 84), dtype=np.uint8)
    frames = torch.from_numpy(obs)
    torch_actor = TorchPolicyActor(net)
    cl_net = ActorCritic(spec(), PolicyConfig()).eval().to(memory_format=torch.channels_last)

    def no_grad() -> None:
        torch_actor._outputs(obs)

    def inference() -> None:
        with torch.inference_mode():
            net._heads(frames)

    def channels_last() -> None:
        with torch.inference_mode():
            cl_net._heads(frames)

    variants = {
        "torch no_grad (rlfarm before)": no_grad,
        "torch inference_mode": inference,
        "torch channels_last": channels_last,
    }
    if compile_:
        compiled = torch.compile(net._heads)
        t = time.perf_counter()
        with torch.inference_mode():
            compiled(frames)
        print(f"  torch.compile of the actor: {time.perf_counter() - t:.1f} s to compile")

        def compiled_step() -> None:
            with torch.inference_mode():
                compiled(frames)

        variants["torch.compile"] = compiled_step
    graph = onnx_graph(net, _Heads(net), spec())
    if graph is not None:
        onnx_actor = OnnxPolicyActor(net, graph)
        variants["ONNX Runtime (rlfarm)"] = lambda: onnx_actor._outputs(obs)
    else:
        print('  ONNX Runtime: not installed (pip install -e ".[atari]")')
    return variants


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256, help="learner minibatch")
    parser.add_argument("--act-batch", type=int, default=8, help="frames per acting step (a task's envs)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    fwd, first = flops_per_obs()
    fwd_bwd = 3 * fwd - first
    cores = os.cpu_count() or 1
    print(
        f"Nature CNN: {fwd / 1e6:.1f} MFLOP forward, {fwd_bwd / 1e6:.1f} forward+backward per frame; "
        f"{cores} cores, torch {torch.__version__}"
    )
    for threads in sorted({1, cores}):
        peak = matmul_gflops(threads)  # also sets torch's threads
        print(f"learner, {threads} thread(s), minibatch {args.batch} (attainable {peak:.0f} GFLOP/s):")
        report(rounds(learner_variants(args.batch, not args.no_compile), repeats=3), "nchw", args.batch, fwd_bwd, peak)
    peak = matmul_gflops(1)
    print(f"actor, 1 thread, {args.act_batch} frames a step (attainable {peak:.0f} GFLOP/s):")
    report(
        rounds(actor_variants(args.act_batch, not args.no_compile), repeats=40),
        "torch no_grad (rlfarm before)",
        args.act_batch,
        fwd,
        peak,
    )


def report(results: dict[str, float], base: str, frames: int, flops_per_frame: float, peak: float) -> None:
    """One line per variant: time per call, frames/s, GFLOP/s, its share of `peak`, speed-up over `base`."""
    for name, seconds in results.items():
        rate = frames * flops_per_frame / seconds / 1e9
        print(
            f"  {name:<30} {seconds * 1e3:7.2f} ms  {frames / seconds:6.0f} frames/s  {rate:5.1f} GFLOP/s = "
            f"{rate / peak:.2f} of attainable  {results[base] / seconds:.2f}x {base}"
        )


if __name__ == "__main__":
    main()
