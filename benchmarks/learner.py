"""Learner throughput: samples per second through one update of the trainer's learner, on CPU and,
where there is one, on CUDA, for the `pong` preset (Nature CNN on 4x84x84 uint8 frames) and for a
CartPole MLP. Synthetic batches of the shapes a real result has; no farm.

    python benchmarks/learner.py                       # every preset below, on cpu (and cuda if present)
    python benchmarks/learner.py --device cuda --batches 20
    python benchmarks/learner.py --threads 1 --profile # torch.profiler's table of one pong update

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


def bench(preset: str, mode: str, overrides: list[str], device_name: str, batches: int) -> tuple[int, float, float]:
    """(samples per update, seconds per update (median), samples/s including the epochs)."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos import learner
    from rlfarm.envs import SpaceSpec, describe

    cfg = C.build(preset, [f"mode={mode}", *overrides])
    try:
        spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    except Exception:  # the atari extra missing: the shapes are known
        spec = SpaceSpec(4 * 84 * 84, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8")
    device = torch.device(device_name)
    algorithm = learner(cfg.algo, cfg.mode)(cfg, spec, device)
    results = max(1, cfg.async_.results_per_update) if mode == "async" else cfg.farm.num_tasks
    rng = np.random.default_rng(0)
    rollouts = [synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs, rng) for _ in range(results)]
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.profile:
        profile("pong", "async", [])
        return
    print(f"cores: {os.cpu_count()}, torch threads: {args.threads}, torch {torch.__version__}")
    print(f"{'case':<50} {'device':>6} {'batch':>6} {'s/update':>9} {'env steps/s':>12} {'samples/s':>10}")
    for name, (preset, mode, overrides) in CASES.items():
        for device in args.device:
            samples, seconds, rate = bench(preset, mode, overrides, device, args.batches)
            print(
                f"{name:<50} {device:>6} {samples:>6} {seconds:>9.3f} {samples / seconds:>12.0f} {rate:>10.0f}",
                flush=True,
            )
    print("env steps/s: the rate at which the learner consumes results; samples/s counts every epoch")


if __name__ == "__main__":
    main()
