"""Result arrays on the wire: compression in rlfarm.core.codec, farm.compress, and the worker's size checks.
Pure: no Redis, no workers (benchmarks/wire.py measures the same on real Atari rollouts)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zstandard

from rlfarm import config as C
from rlfarm.core import codec
from rlfarm.core.protocol import Result

RAW, COMPRESSED = 42, 43  # codec's msgpack extension codes, as they appear on the wire


def frame_stacks(steps: int, envs: int, seed: int = 0, noise: bool = False) -> np.ndarray:
    """(T, N, 4, 84, 84) uint8 observations built as FrameStackObservation builds them: observation
    t+1 is observation t shifted by one frame plus a new frame. Frames are a flat background with a
    moving block, or (noise) random bytes, which only the sharing between steps can compress."""
    rng = np.random.default_rng(seed)
    frames = np.full((envs, steps + 3, 84, 84), 87, np.uint8)
    for i in range(steps + 3):
        if noise:
            frames[:, i] = rng.integers(0, 256, (envs, 84, 84), dtype=np.uint8)
        else:
            frames[:, i, 10 + i % 60 : 14 + i % 60, 20:22] = 236
    obs = np.stack([frames[:, t : t + 4] for t in range(steps)])  # (T, N, 4, 84, 84)
    assert obs.shape == (steps, envs, 4, 84, 84) and np.array_equal(obs[1, :, :3], obs[0, :, 1:])
    return obs


def ext_codes(payload: bytes) -> dict[str, int]:
    """The msgpack extension code each top-level field of a payload travels in."""
    return msgpack.unpackb(payload, ext_hook=lambda code, data: code, raw=False)


def ext_payload(header: list, body: bytes, code: int = COMPRESSED) -> bytes:
    """A message whose field `x` is an extension of `code` with this header and body: a tampered
    payload built by hand, as a hostile or broken writer to Redis could."""
    return msgpack.packb({"x": msgpack.ExtType(code, msgpack.packb(header) + body)}, use_bin_type=True)


# ---- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", codec.COMPRESS_CHOICES)
def test_arrays_round_trip_identical_with_every_choice(compress):
    rng = np.random.default_rng(1)
    message = {
        "obs": frame_stacks(16, 4),  # uint8 images, compressible
        "noise": rng.integers(0, 256, (64, 1024), dtype=np.uint8),  # incompressible: stays raw
        "values": rng.standard_normal((1024, 8)).astype(np.float32),
        "actions": rng.integers(0, 6, (1024, 8)),  # int64
        "dones": np.zeros((4096, 8), bool),
        "doubles": np.linspace(0, 1, 5000),  # float64
        "transposed": np.arange(40000, dtype=np.float32).reshape(200, 200).T,  # not C-contiguous
        "empty": np.zeros((0, 4, 84, 84), np.uint8),
        "scalar": np.float32(2.5),
        "text": "ok",
    }
    out = codec.unpack(codec.pack(message, compress=compress))
    for key, value in message.items():
        if isinstance(value, np.ndarray):
            assert out[key].dtype == value.dtype and out[key].shape == value.shape, key
            np.testing.assert_array_equal(out[key], value, err_msg=key)
    assert out["scalar"] == 2.5 and out["text"] == "ok"


def test_a_result_message_round_trips_compressed():
    rollout = {"obs": frame_stacks(32, 4), "rewards": np.zeros((32, 4), np.float32)}
    result = Result("rollout", 3, 1, version=7, rollout=rollout)
    back = Result.from_message(codec.unpack(codec.pack(result.to_message(), compress="auto")))
    assert back.key == ("rollout", 3, 1) and back.version == 7
    assert back.rollout["obs"].dtype == np.uint8
    np.testing.assert_array_equal(back.rollout["obs"], rollout["obs"])


# ---- what gets compressed, and how much ------------------------------------------------------------


def test_frame_stacked_rollouts_compress_many_times():
    obs = frame_stacks(64, 8)
    raw, packed = len(codec.pack({"obs": obs})), len(codec.pack({"obs": obs}, compress="auto"))
    assert raw > obs.nbytes and raw / packed >= 100, raw / packed


def test_the_frames_consecutive_steps_share_are_sent_once():
    """Random frames cannot be compressed, but each step adds one new frame to three already sent:
    a codec whose window reaches the previous step (N*4*84*84 bytes back) sends each frame about once.
    With 8 envs that is 220 KiB back, beyond lz4's 64 KiB window: this would fail with lz4."""
    obs = frame_stacks(32, 8, noise=True)
    packed = len(codec.pack({"obs": obs}, compress="auto"))
    unique_frames = obs.shape[1] * (obs.shape[0] + 3)
    assert packed < 1.1 * unique_frames * 84 * 84, packed / obs.nbytes
    assert obs.nbytes / packed >= 3


def test_small_incompressible_and_uncompressed_arrays_travel_raw():
    big = frame_stacks(8, 2)
    small = np.zeros(codec.COMPRESS_MIN_BYTES // 8 - 1, np.int64)  # just under the threshold
    noise = np.random.default_rng(0).integers(0, 256, 4 * codec.COMPRESS_MIN_BYTES, dtype=np.uint8)
    message = {"big": big, "small": small, "noise": noise}
    assert ext_codes(codec.pack(message, compress="auto")) == {"big": COMPRESSED, "small": RAW, "noise": RAW}
    assert ext_codes(codec.pack(message, compress="zstd"))["big"] == COMPRESSED
    assert ext_codes(codec.pack(message)) == dict.fromkeys(message, RAW)  # the default: none
    assert ext_codes(codec.pack(message, compress="none")) == dict.fromkeys(message, RAW)
    at_threshold = np.zeros(codec.COMPRESS_MIN_BYTES, np.uint8)
    assert ext_codes(codec.pack({"x": at_threshold}, compress="auto")) == {"x": COMPRESSED}


def test_raw_arrays_still_decode_zero_copy_and_read_only():
    out = codec.unpack(codec.pack({"x": np.arange(10, dtype=np.float32)}, compress="auto"))
    assert out["x"].base is not None and not out["x"].flags.writeable


def test_pack_refuses_an_unknown_compression():
    with pytest.raises(ValueError, match="compress must be one of auto, none, zstd"):
        codec.pack({"x": np.zeros(4)}, compress="lz4")


# ---- tampered payloads -----------------------------------------------------------------------------


def zstd_frame(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def test_a_truncated_payload_is_a_codec_error():
    payload = codec.pack({"obs": frame_stacks(16, 4)}, compress="auto")
    for cut in (len(payload) - 1, len(payload) // 2, 40, 5):
        with pytest.raises(codec.CodecError):
            codec.unpack(payload[:cut])


def test_a_truncated_frame_inside_a_whole_message_is_a_codec_error():
    frame = zstd_frame(bytes(100_000))
    with pytest.raises(codec.CodecError, match="zstd"):
        codec.unpack(ext_payload(["zstd", "|u1", [100_000]], frame[:-3]))
    with pytest.raises(codec.CodecError):
        codec.unpack(ext_payload(["zstd", "|u1", [100_000]], frame + b"trailing bytes"))


@pytest.mark.parametrize("shape", [[200_000], [50_000], [10, 10_000]])
def test_a_declared_shape_other_than_the_data_is_a_codec_error(shape):
    frame = zstd_frame(bytes(100_000))  # 100,000 bytes of uint8; [10, 10_000] is right but float64
    dtype = "<f8" if len(shape) == 2 else "|u1"
    with pytest.raises(codec.CodecError, match="declares"):
        codec.unpack(ext_payload(["zstd", dtype, shape], frame))


def test_a_huge_declared_size_is_refused_before_anything_is_allocated():
    frame = zstd_frame(bytes(1000))
    for shape in ([2**40], [2**31, 2**31, 2**31]):  # 1 TiB; and more than any integer type holds
        with pytest.raises(codec.CodecError, match="more than the"):
            codec.unpack(ext_payload(["zstd", "|u1", shape], frame))


def test_a_decompression_bomb_is_refused_by_the_bound():
    bomb = codec.pack({"a": np.zeros(8 * 2**20, np.uint8), "b": np.zeros(8 * 2**20, np.uint8)}, compress="auto")
    assert len(bomb) < 4096
    assert codec.unpack(bomb, max_bytes=16 * 2**20)["b"].size == 8 * 2**20
    with pytest.raises(codec.CodecError, match="more than the"):  # the bound is over the whole message
        codec.unpack(bomb, max_bytes=12 * 2**20)


@pytest.mark.parametrize(
    "header",
    [
        ["lz4", "|u1", [10]],
        ["zstd", "|O", [10]],
        ["zstd", "not a dtype", [10]],
        ["zstd", "|u1", [-1]],
        ["zstd", "|u1", "10"],
        ["zstd", "|u1"],
        "zstd",
    ],
)
def test_a_malformed_header_is_a_codec_error(header):
    with pytest.raises(codec.CodecError):
        codec.unpack(ext_payload(header, zstd_frame(bytes(10))))


def test_any_byte_flipped_or_cut_is_a_codec_error_or_the_declared_array():
    """Without RLFARM_SECRET nothing authenticates a result: whatever a broken writer leaves, decoding
    either fails with CodecError or yields the array the header declares, never another exception."""
    obs = frame_stacks(8, 2)
    payload = codec.pack({"obs": obs}, compress="auto")
    rng = np.random.default_rng(0)
    for _ in range(300):
        bad = bytearray(payload)
        if rng.random() < 0.5:
            bad[rng.integers(len(bad))] ^= 1 << int(rng.integers(8))
        else:
            del bad[rng.integers(len(bad)) :]
        try:
            out = codec.unpack(bytes(bad), max_bytes=2**24)
        except codec.CodecError:
            continue
        if isinstance(out.get("obs"), np.ndarray):  # a flip in the array's bytes or in the map's keys
            assert out["obs"].size * out["obs"].itemsize <= 2**24


# ---- farm.compress ---------------------------------------------------------------------------------


def test_config_and_codec_agree_on_the_choices():
    assert C.COMPRESS == codec.COMPRESS_CHOICES
    assert C.build("cartpole-ppo").farm.compress == "auto"
    assert C.build("cartpole-ppo", ["farm.compress=none"]).farm.compress == "none"


def test_a_bad_farm_compress_is_one_config_error_line():
    with pytest.raises(C.ConfigError) as err:
        C.build("cartpole-ppo", ["farm.compress=gzip"])
    assert str(err.value) == "farm.compress must be one of auto, none, zstd, got 'gzip'"


# ---- the worker's checks ---------------------------------------------------------------------------


def big_result() -> Result:
    return Result("rollout", 0, 0, version=1, rollout={"obs": frame_stacks(64, 8)})  # 14.5 MB raw


def test_the_worker_checks_max_result_bytes_on_the_compressed_payload():
    from rlfarm.errors import ResultTooLarge
    from rlfarm.worker.results import encode_result

    payload = encode_result(big_result(), {"compress": "auto", "max_result_bytes": 2**20})
    assert len(payload) < 2**20 and ext_codes(payload)["rollout"]["obs"] == COMPRESSED
    with pytest.raises(ResultTooLarge, match=r"over farm.max_result_bytes \(1.0 MiB\)"):
        encode_result(big_result(), {"compress": "none", "max_result_bytes": 2**20})


def test_runs_without_farm_compress_get_raw_arrays():
    """Their run meta was written by a trainer that predates compression and cannot decode it."""
    from rlfarm.worker.results import encode_result

    assert ext_codes(encode_result(big_result(), {}))["rollout"]["obs"] == RAW


def test_the_worker_refuses_results_the_trainer_would_not_decompress(monkeypatch):
    from rlfarm.errors import ResultTooLarge
    from rlfarm.worker.results import encode_result

    monkeypatch.setattr(codec, "MAX_DECODED_BYTES", 2**20)
    with pytest.raises(ResultTooLarge, match="a trainer decodes from one result"):
        encode_result(big_result(), {"compress": "auto"})
