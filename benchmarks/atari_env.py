"""Atari vector envs on one core: what a step of a task's envs costs, and what saving and restoring
their state (an env stream moving between processes) costs.

    pip install -e ".[atari]"
    python benchmarks/atari_env.py                      # 4 envs of PongNoFrameskip-v4
    python benchmarks/atari_env.py --envs 8 --steps 400 --rounds 7

Step (random actions, DeepMind's preprocessing: no-op starts up to 30, frame skip 4 with max-pool,
84x84 grayscale, 4 stacked frames), milliseconds per step of the whole vector:
  AleVector     rlfarm.envs.ale_vector.AleVector: one ale_py.ALEInterface per sub-env, one Python loop
  native        ale-py's C++ AtariVectorEnv, one thread, set up as rlfarm's NativeVector did (its
                outputs copied and rewards clipped, as NativeVector did); its state cannot be saved
  chain         the gymnasium wrapper chain (rlfarm.envs.make_env) in a SAME_STEP SyncVectorEnv
Variants are timed in alternating rounds in one process (median of rounds), so a machine whose speed
drifts (shared cores) shifts them all alike.

Snapshot of the AleVector's sub-envs (PongNoFrameskip-v4, and ALE/Pong-v5 whose sticky actions
AleVector follows and checks at each snapshot): its size as codec.pack writes it, raw and with the
zstd compression results use (what would be stored), and the milliseconds of snapshot(), of
packing and unpacking it, of restore() into an AleVector of the same id and size, and of making a
fresh AleVector to restore into (ale-py loads the ROM for each sub-env).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlfarm.core import codec


def _native(env_id: str, num_envs: int) -> Any:
    """ale-py's AtariVectorEnv as rlfarm's NativeVector made it (rlfarm before AleVector)."""
    import gymnasium as gym
    from ale_py.vector_env import AtariVectorEnv

    registered = gym.registry[env_id].kwargs
    return AtariVectorEnv(
        registered["game"],
        num_envs,
        num_threads=1,
        autoreset_mode="SameStep",
        repeat_action_probability=float(registered.get("repeat_action_probability", 0.25)),
        full_action_space=bool(registered.get("full_action_space", False)),
        max_num_frames_per_episode=int(registered.get("max_num_frames_per_episode", 108_000)),
        img_height=84,
        img_width=84,
        grayscale=True,
        stack_num=4,
        frameskip=4,
        maxpool=True,
        noop_max=30,
        episodic_life=False,
        reward_clipping=False,
        use_fire_reset=False,
    )


def steppers(env_id: str, num_envs: int, actions: np.ndarray) -> dict[str, Callable[[], None]]:
    """Each variant reset with seed 0, as a function stepping it through `actions` (T, N)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfarm.envs import make_env
    from rlfarm.envs.ale_vector import AleVector

    ale = AleVector(env_id, num_envs, {})
    native = _native(env_id, num_envs)
    chain = SyncVectorEnv([lambda: make_env(env_id)] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    ale.reset(seed=0)
    native.reset(seed=np.arange(num_envs))
    chain.reset(seed=0)

    def run(step: Callable[[np.ndarray], Any]) -> Callable[[], None]:
        def go() -> None:
            for a in actions:
                step(a)

        return go

    def native_step(a: np.ndarray) -> None:  # what NativeVector did around the library's step
        obs, reward, terminated, truncated, info = native.step(a)
        np.array(obs), np.sign(np.asarray(reward, np.float32))
        if "final_obs" in info:
            np.array(info["final_obs"])

    return {"AleVector": run(ale.step), "native": run(native_step), "chain": run(chain.step)}


def rounds(variants: dict[str, Callable[[], None]], n_rounds: int) -> dict[str, float]:
    """Median seconds of one call of each variant, timed in alternating rounds."""
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n_rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def snapshot_costs(env_id: str, num_envs: int, steps: int, repeats: int) -> dict[str, float]:
    """Sizes (bytes) and times (ms) of an AleVector's snapshot after `steps` random steps."""
    from rlfarm.envs.ale_vector import AleVector

    envs = AleVector(env_id, num_envs, {})
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        envs.step(rng.integers(0, envs.single_action_space.n, num_envs))
    snap = envs.snapshot()
    raw, packed = codec.pack(snap), codec.pack(snap, compress="zstd")
    target = AleVector(env_id, num_envs, {})
    unpacked = codec.unpack(packed)
    target.restore(unpacked)
    assert codec.pack(target.snapshot()) == raw  # the same state, every byte
    return {
        "ale_bytes": float(snap["ale_state_sizes"].mean()),
        "raw": len(raw),
        "zstd": len(packed),
        "snapshot_ms": median_ms(envs.snapshot, repeats),
        "pack_ms": median_ms(lambda: codec.pack(snap, compress="zstd"), repeats),
        "unpack_ms": median_ms(lambda: codec.unpack(packed), repeats),
        "restore_ms": median_ms(lambda: target.restore(unpacked), repeats),
        "fresh_ms": median_ms(lambda: AleVector(env_id, num_envs, {}), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--envs", type=int, default=4, help="sub-envs per vector")
    parser.add_argument("--steps", type=int, default=200, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30, help="snapshot and restore timings: median of these")
    args = parser.parse_args()

    from rlfarm.envs.atari import register

    register()
    actions = np.random.default_rng(0).integers(0, 6, (args.steps, args.envs))
    per_step = {
        name: 1e3 * s / args.steps for name, s in rounds(steppers(args.env, args.envs, actions), args.rounds).items()
    }
    print(f"{args.envs} x {args.env}, random actions, {args.steps} steps x {args.rounds} rounds (median):")
    print(f"  {'vector env':<12} {'ms/step':>8} {'vs AleVector':>13} {'vs chain':>9}")
    for name, ms in per_step.items():
        print(f"  {name:<12} {ms:8.2f} {ms / per_step['AleVector']:12.2f}x {per_step['chain'] / ms:8.2f}x")
    print("  (vs AleVector: time relative to AleVector's; vs chain: speed relative to the wrapper chain's)")

    print(f"\nsnapshot of {args.envs} sub-envs after 300 random steps (median of {args.repeats}):")
    header = (
        f"  {'env':<20} {'ALE state':>10} {'msgpack':>9} {'zstd':>8} {'ratio':>6} {'snapshot':>9} "
        f"{'pack zstd':>10} {'unpack':>7} {'restore':>8} {'fresh env':>10}"
    )
    print(header)
    for env_id in (args.env, "ALE/Pong-v5"):
        c = snapshot_costs(env_id, args.envs, 300, args.repeats)
        print(
            f"  {env_id:<20} {c['ale_bytes'] / 1e3:8.1f}KB {c['raw'] / 1e3:7.1f}KB {c['zstd'] / 1e3:6.1f}KB "
            f"{c['raw'] / c['zstd']:5.1f}x {c['snapshot_ms']:7.2f}ms {c['pack_ms']:8.2f}ms {c['unpack_ms']:5.2f}ms "
            f"{c['restore_ms']:6.2f}ms {c['fresh_ms']:8.0f}ms"
        )
    print(
        "  (ALE state: one sub-env's serialized ALEState with its RNG; msgpack: codec.pack raw; zstd:\n"
        "   codec.pack(compress='zstd'), what would be stored; fresh env: making an AleVector to restore into)"
    )


if __name__ == "__main__":
    main()
