"""Bytes per env step on the wire, and what compressing result arrays costs: codecs compared on
rollouts made as a worker makes them, without a farm.

    python benchmarks/wire.py
    python benchmarks/wire.py --steps 128 --envs 8 --repeats 7

Rollouts (rlfarm.core.rollout.collect with an untrained PPO actor, whose near-uniform policy acts at
random, in SAME_STEP vector envs, as on a worker):
  - Atari, when ale_py is importable: ALE/Pong-v5 and ALE/Breakout-v5 with frameskip=1, wrapped in
    AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30) and
    FrameStackObservation(4): 4x84x84 uint8 observations, consecutive ones sharing 3 of 4 frames.
    Pong also as an off-policy result (DQN keeps next_obs, twice the frames).
  - CartPole-v1: the farm's default task size (256 steps x 4 envs), float32 vectors.

For each, the whole result message (Result.to_message, as the worker packs it) with each codec:
bytes per env step, ratio to no compression, encode and decode milliseconds per result (median of
--repeats, wall clock by perf_counter and CPU by process_time) and MB/s of raw array bytes; zstd 3
also with a frame checksum. Every codec compresses the same arrays (those codec.pack would: at least
its threshold, and only where that saves 10%), framed by codec.pack; the last row is
codec.pack(compress="auto") itself. A second table sweeps codec.pack's threshold. Every figure
printed comes from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfarm.core import codec

ATARI = ("ALE/Pong-v5", "ALE/Breakout-v5")


# ---- rollouts ------------------------------------------------------------------------------------


def _atari_factory(env_id: str) -> Callable[[], Any]:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)

    def make() -> gym.Env:
        env = gym.make(env_id, frameskip=1)
        env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        return gym.wrappers.FrameStackObservation(env, 4)

    return make


def _cartpole_factory() -> Callable[[], Any]:
    import gymnasium as gym

    return lambda: gym.make("CartPole-v1")


def rollout_message(factory: Callable[[], Any], steps: int, envs: int, keep_next_obs: bool) -> dict:
    """The message a worker would pack for one rollout task of `steps` x `envs` env steps."""
    import torch
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfarm.algos import learner
    from rlfarm.config import PolicyConfig
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.envs import space_spec

    torch.set_num_threads(1)  # as on a worker
    torch.manual_seed(0)
    probe = factory()
    spec = space_spec(probe)
    probe.close()
    algorithm = learner("ppo")
    actor = algorithm.actor_snapshot(algorithm.build_network(spec, PolicyConfig()))
    vec = SyncVectorEnv([factory] * envs, autoreset_mode=AutoresetMode.SAME_STEP)
    env_seeds, action_seed = task_seeds(0, 0, 0, envs)
    started = time.perf_counter()
    rollout = collect(actor, vec, steps, env_seeds, action_seed, keep_next_obs=keep_next_obs)
    duration = time.perf_counter() - started  # what a worker spends on the task before encoding
    vec.close()
    result = Result(
        "rollout",
        0,
        0,
        task_id="bench",
        worker="bench:1",
        version=0,
        duration=duration,
        finished=time.time(),
        rollout=rollout.to_dict(),
    )
    return result.to_message()


def without_next_obs(message: dict) -> dict:
    return {**message, "rollout": {**message["rollout"], "next_obs": None, "terminations": None}}


# ---- codecs compared -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    compress: Callable[[np.ndarray], bytes] | None  # None: raw arrays
    decompress: Callable[[bytes], bytes] | None = None


def candidates() -> list[Candidate]:
    import zstandard

    out = [Candidate("none", None)]
    try:
        import lz4.frame
    except ImportError:
        print("(lz4 is not installed: its rows are left out)")
    else:
        out += [
            Candidate("lz4", lambda a: lz4.frame.compress(a), lz4.frame.decompress),
            Candidate("lz4 hc3", lambda a: lz4.frame.compress(a, compression_level=3), lz4.frame.decompress),
        ]
    for level, checksum in ((1, False), (3, False), (3, True)):
        out.append(
            Candidate(
                f"zstd {level}" + (" +checksum" if checksum else ""),
                lambda a, lv=level, ck=checksum: zstandard.ZstdCompressor(level=lv, write_checksum=ck).compress(a),
                lambda b: zstandard.ZstdDecompressor().decompress(b),
            )
        )
    return out


def _flat(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def encode_with(message: dict, cand: Candidate) -> bytes:
    """The message with the arrays codec.pack would compress replaced by `cand`'s bytes."""
    if cand.compress is None:
        return codec.pack(message)
    rollout = {}
    for key, arr in message["rollout"].items():
        if isinstance(arr, np.ndarray) and arr.nbytes >= codec.COMPRESS_MIN_BYTES:
            data = cand.compress(_flat(arr))
            if len(data) <= codec.WORTH_RATIO * arr.nbytes:
                arr = {"z": data, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        rollout[key] = arr
    return codec.pack({**message, "rollout": rollout})


def decode_with(payload: bytes, cand: Candidate) -> dict:
    message = codec.unpack(payload)
    if cand.decompress is None:
        return message
    for key, value in message["rollout"].items():
        if isinstance(value, dict):
            arr = np.frombuffer(cand.decompress(value["z"]), dtype=value["dtype"])
            message["rollout"][key] = arr.reshape(value["shape"])
    return message


# ---- measuring -----------------------------------------------------------------------------------


@dataclass
class Timing:
    wall_ms: float
    cpu_ms: float


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, Timing]:
    """fn's result and its median time, after one call untimed: the first allocation of tens of MB
    pays page faults that a trainer decoding result after result mostly does not."""
    walls, cpus, out = [], [], fn()
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return out, Timing(1e3 * statistics.median(walls), 1e3 * statistics.median(cpus))


def check_equal(message: dict, decoded: dict) -> None:
    for key, arr in message["rollout"].items():
        if isinstance(arr, np.ndarray):
            got = decoded["rollout"][key]
            assert got.dtype == arr.dtype and np.array_equal(got, arr), key


def row(name: str, payload: bytes, base: int, steps: int, raw_mb: float, enc: Timing, dec: Timing) -> str:
    # Raw arrays decode copy-free in microseconds: a rate would say nothing.
    mbps = lambda t: f"{raw_mb / (t.wall_ms / 1e3):8.0f}" if t.wall_ms > 0.05 else f"{'-':>8}"
    return (
        f"  {name:<16} {len(payload) / steps:>10,.1f} {base / len(payload):>7.1f}x "
        f"{enc.wall_ms:>8.2f} {enc.cpu_ms:>8.2f} {dec.wall_ms:>8.2f} {dec.cpu_ms:>8.2f} "
        f"{mbps(enc)} {mbps(dec)}"
    )


HEADER = (
    f"  {'codec':<16} {'B/env step':>10} {'ratio':>8} {'enc ms':>8} {'enc cpu':>8} "
    f"{'dec ms':>8} {'dec cpu':>8} {'enc MB/s':>8} {'dec MB/s':>8}"
)


def codec_table(title: str, message: dict, repeats: int) -> None:
    steps = int(message["rollout"]["rewards"].size)
    raw_mb = codec.array_bytes(message) / 1e6
    base = len(codec.pack(message))
    print(
        f"\n{title}: {steps} env steps, arrays {raw_mb:.2f} MB, "
        f"obs {message['rollout']['obs'].dtype} {message['rollout']['obs'].shape[2:]}, "
        f"collected in {message['duration'] * 1e3:.0f} ms"
    )
    print(HEADER)
    for cand in candidates():
        payload, enc = timed(lambda cand=cand: encode_with(message, cand), repeats)
        decoded, dec = timed(lambda payload=payload, cand=cand: decode_with(payload, cand), repeats)
        check_equal(message, decoded)
        print(row(cand.name, payload, base, steps, raw_mb, enc, dec))
    payload, enc = timed(lambda: codec.pack(message, compress="auto"), repeats)
    decoded, dec = timed(lambda: codec.unpack(payload), repeats)
    check_equal(message, decoded)
    print(row("codec.pack auto", payload, base, steps, raw_mb, enc, dec))


def threshold_table(title: str, message: dict, repeats: int) -> None:
    steps = int(message["rollout"]["rewards"].size)
    raw_mb = codec.array_bytes(message) / 1e6
    base = len(codec.pack(message))
    sizes = sorted(f"{k} {v.nbytes}" for k, v in message["rollout"].items() if isinstance(v, np.ndarray))
    print(f"\n{title}: codec.pack(compress='auto', threshold=...); arrays (bytes): {', '.join(sizes)}")
    print(HEADER.replace("codec           ", "threshold       "))
    for threshold in (0, 2**10, 4 * 2**10, 16 * 2**10, 64 * 2**10, 2**20):
        payload, enc = timed(lambda t=threshold: codec.pack(message, compress="auto", threshold=t), repeats)
        _, dec = timed(lambda payload=payload: codec.unpack(payload), repeats)
        print(row(f"{threshold // 2**10} KiB", payload, base, steps, raw_mb, enc, dec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=128, help="Atari steps per env in one task")
    parser.add_argument("--envs", type=int, default=8, help="Atari envs in one task")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rollouts: list[tuple[str, dict]] = []
    try:
        import ale_py  # noqa: F401
    except ImportError:
        print("(ale_py is not installed: Atari rollouts are left out)")
    else:
        for env_id in ATARI:
            name = f"{env_id} {args.steps}x{args.envs}"
            if env_id == ATARI[0]:  # one collect gives both: the on-policy result drops next_obs
                message = rollout_message(_atari_factory(env_id), args.steps, args.envs, keep_next_obs=True)
                rollouts.append((name, without_next_obs(message)))
                rollouts.append((f"{name}, off-policy (next_obs kept)", message))
            else:
                rollouts.append((name, rollout_message(_atari_factory(env_id), args.steps, args.envs, False)))
    rollouts.append(("CartPole-v1 256x4", rollout_message(_cartpole_factory(), 256, 4, keep_next_obs=False)))
    print(f"median of {args.repeats}; ms per result; MB/s of raw array bytes through encode / decode")
    for title, message in rollouts:
        codec_table(title, message, args.repeats)
    for title, message in (rollouts[0], rollouts[-1]):
        threshold_table(title, message, args.repeats)


if __name__ == "__main__":
    main()
