"""Learner throughput: samples per second through one update of the trainer's learner, on CPU and,
where there is one, on CUDA, for the `pong` preset (Nature CNN on 4x84x84 uint8 frames) and for a
CartPole MLP. Synthetic batches of the shapes a real result has; no farm.

    python benchmarks/learner.py                       # every preset below, on cpu (and cuda if present)
    python benchmarks/learner.py --device cuda --batches 20
    python benchmarks/learner.py --threads 1 --profile # torch.profiler's table of one pong update
    python benchmarks/learner.py --device cuda --precision fp32 bf16 --peak --cases pong

`--precision`: each case with `ppo.precision` fp32 and/or bf16 (the layers under bf16 autocast).
`--compile MODE`: also with `ppo.compile=MODE`, the network's layers in the minibatches (forward and
backward) under `torch.compile`: `default`, `reduce-overhead` (CUDA graphs on a GPU) or
`max-autotune-no-cudagraphs`; the first update, which compiles, is not timed but its seconds are printed.

`--peak`: also the device's attainable matmul rate in the case's precision (a large square matmul,
median of rounds) and the learner's FLOP rate as a fraction of it, the FLOPs counted from the
network's layers (forward: 2 x multiply-adds; backward: twice the forward, less the first layer's
input gradient).

samples/s = samples in the batch x update epochs / seconds per update: the rate at which the learner
consumes env steps is batch / seconds; divide the farm's env steps/s by it to see whether one learner
keeps up (benchmarks/throughput.py measures the farm's side).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

CASES = {  # name: (preset, mode, overrides)
    "pong-sync (PPO as shipped, 4 epochs of 8x128)": ("pong", "sync", []),
    "pong-appo (APPO as shipped)": ("pong-appo", "async", []),
    "pong as shipped (APPO, one pass, 8x128)": ("pong", "async", []),
    # V-trace's targets by a forward over the batch first, then one epoch: the cost of the two-pass
    # path (the ablation without V-trace takes it too, with the same forwards).
    "pong, targets first, then 1 epoch": ("pong", "async", ["ppo.vtrace=false"]),
    "pong, PPO's 4 epochs (targets first)": ("pong", "async", ["ppo.update_epochs=4"]),
    "cartpole-ppo (SYNC, MLP 64x64, 4096 per update)": ("cartpole-ppo", "sync", []),
}


def synthetic_rollout(spec, steps: int, envs: int, rng: np.random.Generator):
    from rlfarm.core.rollout import Rollout

    if spec.obs_dtype == "uint8":
        obs = rng.integers(0, 256, (steps, envs, *spec.obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((steps, envs, *spec.obs_shape)).astype(np.float32)
    z = np.zeros((steps, envs), np.float32)
    return Rollout(
        obs=obs,
        actions=rng.integers(0, spec.action_dim, (steps, envs)),
        logprobs=np.full((steps, envs), -np.log(spec.action_dim), np.float32),
        values=z.copy(),
        rewards=rng.choice([-1.0, 0.0, 1.0], (steps, envs)).astype(np.float32),
        dones=rng.random((steps, envs)) < 0.001,
        final_values=z.copy(),
        last_values=np.zeros(envs, np.float32),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        last_obs=obs[-1].copy(),
    )


def matmul_rate(device_name: str, precision: str, size: int = 4096, rounds: int = 5) -> float:
    """Attainable FLOP/s of a size x size matmul on the device in fp32 or bf16 (median of rounds)."""
    import torch

    device = torch.device(device_name)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    size = size if device.type == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    rates = []
    for i in range(rounds + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first round warms up
            rates.append(10 * 2 * size**3 / (time.perf_counter() - t))
    return float(np.median(rates))


def flops_per_sample(preset: str, mode: str, overrides: list[str]) -> float:
    """FLOPs one sample costs the learner per epoch: forward + backward of the network's layers."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import SpaceSpec, describe

    cfg = C.build(preset, [f"mode={mode}", *overrides])
    try:
        spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    except Exception:  # the atari extra missing: the shapes are known
        spec = SpaceSpec(4 * 84 * 84, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8")
    from pong import layer_flops  # (benchmarks/ is on the path of a script run from it)

    dtype = torch.uint8 if spec.obs_dtype == "uint8" else torch.float32
    forward, first = layer_flops(ActorCritic(spec, cfg.policy), torch.zeros((1, *spec.obs_shape), dtype=dtype))
    return 3 * forward - first


def bench(
    preset: str, mode: str, overrides: list[str], device_name: str, batches: int, compile_mode: str = "none"
) -> tuple[int, float, float]:
    """(samples per update, seconds per update (median), samples/s including the epochs)."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos import learner
    from rlfarm.envs import SpaceSpec, describe

    cfg = C.build(preset, [f"mode={mode}", *overrides, f"ppo.compile={compile_mode}"])
    try:
        spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    except Exception:  # the atari extra missing: the shapes are known
        spec = SpaceSpec(4 * 84 * 84, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8")
    device = torch.device(device_name)
    algorithm = learner(cfg.algo, cfg.mode)(cfg, spec, device)
    rng = np.random.default_rng(0)
    if mode == "async":  # APPO takes results_per_update results per update
        results = max(1, cfg.async_.results_per_update)
        rollouts = [synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs, rng) for _ in range(results)]
    else:  # the SYNC trainer hands PPO its whole group joined into one rollout
        results = cfg.farm.num_tasks
        rollouts = [synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs * results, rng)]
    samples = results * cfg.farm.steps_per_env * cfg.env.num_envs
    times = []
    for i in range(batches + 1):  # the first is a warm-up (allocations, cuDNN autotuning)
        for r in rollouts:
            algorithm.observe(r, 0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        while algorithm.ready():
            algorithm.update(0.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t)
        elif compile_mode != "none":
            print(f"  (compile {compile_mode}: first update {time.perf_counter() - t:.1f} s)", flush=True)
    seconds = float(np.median(times))
    return samples, seconds, samples * cfg.ppo.update_epochs / seconds


def profile(preset: str, mode: str, overrides: list[str]) -> None:
    """torch.profiler's operators of one update (after a warm-up one), by self time and input shape."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from rlfarm import config as C
    from rlfarm.algos import learner
    from rlfarm.envs import SpaceSpec

    cfg = C.build(preset, [f"mode={mode}", *overrides])
    spec = SpaceSpec(4 * 84 * 84, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8")
    algorithm = learner(cfg.algo, cfg.mode)(cfg, spec, torch.device("cpu"))
    rollout = synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs, np.random.default_rng(0))
    for record in (False, True):
        algorithm.observe(rollout, 0)
        if not record:
            algorithm.update(0.0)
            continue
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            algorithm.update(0.0)
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", nargs="+", default=["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
    parser.add_argument("--batches", type=int, default=5, help="updates timed per case (median)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads on CPU")
    parser.add_argument("--profile", action="store_true", help="profile one update of the pong preset instead")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"], help="ppo.precision")
    parser.add_argument("--peak", action="store_true", help="the learner's FLOP rate against the device's matmul rate")
    parser.add_argument(
        "--compile",
        nargs="+",
        default=["none"],
        choices=["none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="torch.compile modes of the network's layers to time (none: eager)",
    )
    parser.add_argument("--cases", nargs="+", default=[], help="only the cases whose name starts with one of these")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.profile:
        profile("pong", "async", [])
        return
    print(f"cores: {os.cpu_count()}, torch threads: {args.threads}, torch {torch.__version__}")
    for device in args.device:
        if torch.device(device).type == "cuda":
            print(f"cuda: {torch.cuda.get_device_name(device)}")
    peaks = {}
    if args.peak:
        for device in args.device:
            for precision in args.precision:
                peaks[device, precision] = matmul_rate(device, precision)
                print(f"attainable matmul on {device}, {precision}: {peaks[device, precision] / 1e9:.0f} GFLOP/s")
    header = f"{'case':<50} {'device':>6} {'prec':>5} {'compile':>15} {'batch':>6} {'s/update':>9}"
    header += f" {'env steps/s':>12} {'samples/s':>10}"
    print(header + (f" {'of peak':>8}" if args.peak else ""))
    for name, (preset, mode, overrides) in CASES.items():
        if args.cases and not any(name.startswith(c) for c in args.cases):
            continue
        for device in args.device:
            for precision in args.precision:
                for compile_mode in args.compile:
                    settings = [*overrides, f"ppo.precision={precision}"]
                    try:
                        samples, seconds, rate = bench(preset, mode, settings, device, args.batches, compile_mode)
                    except Exception as exc:  # noqa: BLE001 - a compiler missing on this machine: say so, go on
                        print(f"{name:<50} {device:>6} {precision:>5} {compile_mode:>15} failed: {exc!r:.200}")
                        continue
                    line = f"{name:<50} {device:>6} {precision:>5} {compile_mode:>15} {samples:>6} {seconds:>9.3f}"
                    line += f" {samples / seconds:>12.0f} {rate:>10.0f}"
                    if args.peak:
                        line += f" {rate * flops_per_sample(preset, mode, settings) / peaks[device, precision]:>8.3f}"
                    print(line, flush=True)
    print("env steps/s: the rate at which the learner consumes results; samples/s counts every epoch")


if __name__ == "__main__":
    main()
