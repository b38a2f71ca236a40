"""What AleVector's snapshots are made of (PURE): checked arrays, and the random generators of ALE's
sticky actions and of numpy, as plain values that go through safetensors and msgpack."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfarm.errors import EnvError

_TRUE = 0xFAB1FAB2  # how ALE's Serializer writes `true` (emucore/Deserializer.hxx)
MT_WORDS = 624  # mt19937's state: 624 words (and a position)


def checked_array(state: Mapping[str, Any], key: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    value = state.get(key)
    if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype) or value.shape != tuple(shape):
        found = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ValueError(f"snapshot: {key} must be a {np.dtype(dtype)} array of shape {tuple(shape)}, got {found}")
    return value


def ale_rng(serialized: bytes) -> dict[str, Any]:
    """The sticky-action generator saved in a serialized ALEState, as the state of a numpy MT19937
    at the same point of the same stream. The layout (ale_state.cpp, Serializer.cxx): six
    little-endian int32s, the emulator's state as a string (int32 length, bytes), two int32s; the
    emulator's state ends with the bool `true` and the mt19937 as text: libstdc++ writes its 624
    words and its position, libc++ its 624 words oldest first (the position of a fresh twist: 624)."""
    if len(serialized) < 36:
        raise ValueError("not a serialized ALE state: too short")
    (length,) = struct.unpack_from("<i", serialized, 24)
    if length < 8 or 24 + 4 + length + 8 != len(serialized):
        raise ValueError("not a serialized ALE state: its lengths do not add up")
    inner = serialized[28 : 28 + length]
    start = len(inner.rstrip(b"0123456789 "))  # the text's first byte (its length's last is 0)
    flag, text_length = struct.unpack_from("<Ii", inner, start - 8) if start >= 8 else (0, -1)
    if flag != _TRUE or text_length != len(inner) - start:
        raise ValueError("serialized ALE state without its generator (cloneState(include_rng=True) makes one)")
    numbers = [int(x) for x in inner[start:].split()]
    if len(numbers) == MT_WORDS + 1 and numbers[-1] <= MT_WORDS:
        words, position = numbers[:MT_WORDS], numbers[-1]
    elif len(numbers) == MT_WORDS:
        words, position = numbers, MT_WORDS
    else:
        raise ValueError(f"serialized ALE state: a generator of {len(numbers)} numbers is no mt19937")
    if max(words) >= 2**32:
        raise ValueError("serialized ALE state: mt19937 words must be 32-bit")
    return {"bit_generator": "MT19937", "state": {"key": np.array(words, np.uint32), "pos": position}}


def generator_state(generator: np.random.Generator) -> dict[str, Any]:
    """A numpy generator's state with its 128-bit integers as decimal strings (msgpack carries 64)."""
    state = generator.bit_generator.state
    if state["bit_generator"] != "PCG64":  # gymnasium.utils.seeding.np_random makes PCG64
        raise EnvError(f"cannot save a {state['bit_generator']} generator")
    return {
        "bit_generator": "PCG64",
        "state": str(state["state"]["state"]),
        "inc": str(state["state"]["inc"]),
        "has_uint32": int(state["has_uint32"]),
        "uinteger": int(state["uinteger"]),
    }


def generator(saved: Any) -> np.random.Generator:
    """The generator `_generator_state` saved; ValueError for anything else."""
    try:
        if saved["bit_generator"] != "PCG64":
            raise ValueError(saved["bit_generator"])
        state, inc = int(saved["state"]), int(saved["inc"])
        if not (0 <= state < 2**128 and 0 <= inc < 2**128) or saved["has_uint32"] not in (0, 1):
            raise ValueError("out of range")
        bit_generator = np.random.PCG64()
        bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": inc},
            "has_uint32": int(saved["has_uint32"]),
            "uinteger": int(saved["uinteger"]),
        }
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"snapshot: not a saved PCG64 generator state: {exc!r:.80}") from None
    return np.random.Generator(bit_generator)
