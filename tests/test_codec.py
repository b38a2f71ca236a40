"""rlfarm.core.codec: msgpack with raw arrays, safetensors policies with sha256."""

import numpy as np
import pytest
import torch

from rlfarm.core import codec


def test_pack_roundtrip_arrays_and_scalars():
    msg = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([True, False]),
        "c": np.int64(5),
        "d": "text",
        "e": [1, 2],
        "empty": np.zeros((0, 3), np.int64),
    }
    out = codec.unpack(codec.pack(msg))
    np.testing.assert_array_equal(out["a"], msg["a"])
    assert out["a"].dtype == np.float32 and out["a"].shape == (3, 4)
    assert out["b"].dtype == bool and out["empty"].shape == (0, 3)
    assert out["c"] == 5 and out["d"] == "text" and out["e"] == [1, 2]


def test_pack_refuses_object_arrays_and_garbage():
    with pytest.raises(TypeError):
        codec.pack({"x": np.array([object()])})
    with pytest.raises(codec.CodecError):
        codec.unpack(b"\xc1\xc1\xc1")


def test_policy_blob_roundtrip_and_corruption():
    state = {"w": torch.randn(3, 4), "b": torch.zeros(4)}
    blob = codec.encode_policy(state, {"version": "7", "algo": "ppo"})
    out, meta = codec.decode_policy(blob)
    assert meta["version"] == "7" and meta["algo"] == "ppo" and len(meta["sha256"]) == 64
    assert torch.equal(out["w"], state["w"])
    corrupt = bytearray(blob)
    corrupt[-3] ^= 0xFF  # flip bits inside the tensor data
    with pytest.raises(codec.CodecError, match="checksum"):
        codec.decode_policy(bytes(corrupt))
    assert codec.tensor_digest(state) == meta["sha256"]
