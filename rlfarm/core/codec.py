"""Bytes on the wire and in the policy store, without pickle.

- Task results: msgpack maps whose numpy arrays travel as raw buffers (dtype, shape, bytes) in a
  msgpack extension type, decoded zero-copy with `np.frombuffer`. Asked to (`pack(compress=...)`,
  the run's `farm.compress`), arrays of at least COMPRESS_MIN_BYTES travel zstd-compressed in a second
  extension type; decoding checks the declared size before anything is allocated, so a small
  payload cannot make the trainer allocate gigabytes (benchmarks/wire.py has the measurements).
- Policies: safetensors bytes whose str->str metadata carries version, algo, created and a sha256 of
  the tensors, so a corrupted blob is detected before a worker acts with it; with RLFARM_SECRET set
  also an `hmac` (rlfarm.core.signing), so a forged one is too.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import zstandard

from rlfarm.core import signing
from rlfarm.errors import CodecError

if TYPE_CHECKING:
    import torch

_NDARRAY = 42  # msgpack extension code for numpy arrays: header, raw bytes
_COMPRESSED = 43  # msgpack extension code for compressed numpy arrays: header, compressed bytes

# What farm.compress may say (rlfarm.config keeps the same tuple, without importing this module):
# "auto" is rlfarm's choice, today zstd; "zstd" pins it; "none" sends raw arrays only.
COMPRESS_CHOICES = ("auto", "none", "zstd")
# zstd level 3, chosen by benchmarks/wire.py on Atari rollouts (frame stacks share three of their four
# frames with the previous step): zstd's window reaches that step, lz4's 64 KiB window does not (a
# (T, N, ...) array puts it hundreds of KiB back), so lz4 is several times larger and decodes no
# faster; zstd level 1 is larger at the same speed. Decoding is the trainer's cost, every result on
# one core; encoding a small share of what collecting the steps cost the worker.
ZSTD_LEVEL = 3
# Arrays below this stay raw and zero-copy: in a 1024-step task those are the per-step scalars
# (actions, rewards, values: 1-8 KiB), whose compression saves a few bytes per env step and costs the
# trainer more decode time than the whole rest of a small result (benchmarks/wire.py). Larger tasks'
# scalars pass the threshold and are compressed.
COMPRESS_MIN_BYTES = 16 * 2**10
# A compressed array is sent only when it is at most this fraction of the raw bytes: float noise
# (a trained critic's values) barely compresses, and saving a few percent is not worth the
# decompression and the lost zero-copy decode.
WORTH_RATIO = 0.9
# Bound on the bytes a trainer decompresses from one message (a decompression bomb declares a huge
# shape in a small payload). Workers refuse to send results whose arrays hold more (rlfarm.worker.results).
MAX_DECODED_BYTES = 2 * 2**30


def _header(arr: np.ndarray, codec_name: str | None = None) -> bytes:
    fields = [arr.dtype.str, list(arr.shape)]
    return msgpack.packb(fields if codec_name is None else [codec_name, *fields])


def _compressed(arr: np.ndarray, compress: str, threshold: int) -> msgpack.ExtType | None:
    """The array as a compressed extension, or None where it should travel raw."""
    if compress == "none" or arr.nbytes < threshold:
        return None
    # No frame checksum: it nearly doubles the decode time (Pong: 3.9 ms instead of 2.2) and raw arrays
    # carry none either; with RLFARM_SECRET the result's HMAC covers every byte. The frame does carry
    # its content size, which decoding checks before it allocates.
    data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(arr.reshape(-1).view(np.uint8))
    if len(data) > WORTH_RATIO * arr.nbytes:
        return None
    return msgpack.ExtType(_COMPRESSED, _header(arr, "zstd") + data)


def _encoder(compress: str, threshold: int) -> Callable[[Any], Any]:
    if compress not in COMPRESS_CHOICES:
        raise ValueError(f"compress must be one of {', '.join(COMPRESS_CHOICES)}, got {compress!r}")

    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise TypeError("object arrays cannot be encoded")
            arr = np.ascontiguousarray(obj)
            ext = _compressed(arr, compress, threshold)
            return ext if ext is not None else msgpack.ExtType(_NDARRAY, _header(arr) + arr.tobytes())
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot encode {type(obj).__name__}")

    return default


def _read_header(data: bytes, fields: int) -> tuple[list[Any], int]:
    """The msgpack list that starts an extension's data and where the array bytes begin."""
    # Only the small header is read here, but msgpack's Unpacker refuses to take in more than its
    # buffer limit (100 MiB by default): size it to the data so any result under the run's limit decodes.
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        header = unpacker.unpack()
    except (ValueError, msgpack.UnpackException) as exc:
        raise CodecError(f"unreadable array header: {type(exc).__name__}") from None
    if not isinstance(header, list) or len(header) != fields:
        raise CodecError(f"array header must be a list of {fields} fields, got {header!r:.80}")
    return header, unpacker.tell()


def _array_type(dtype: Any, shape: Any) -> tuple[np.dtype, tuple[int, ...]]:
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise CodecError(f"array shape must be a list of non-negative integers, got {shape!r:.80}")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy answers an unknown dtype string with TypeError
        raise CodecError(f"unknown array dtype {dtype!r:.80}") from None
    if dt.hasobject:
        raise CodecError("object arrays are refused")
    return dt, tuple(shape)


def _zstd_decompress(data: bytes, size: int) -> bytes:
    """Exactly `size` bytes from one zstd frame: its declared content size is checked before the
    output is allocated, and a frame that decodes to other than that, or has trailing bytes, fails."""
    try:
        if zstandard.frame_content_size(data) != size:
            raise CodecError(f"compressed array declares {size} bytes, its frame another size")
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CodecError(f"corrupt zstd frame: {exc}") from None
    if len(out) != size:
        raise CodecError(f"compressed array declares {size} bytes, decoded to {len(out)}")
    return out


def _decoder(max_bytes: int) -> Callable[[int, bytes], Any]:
    """An ext hook that decodes arrays, decompressing at most `max_bytes` over the whole message."""
    left = max_bytes

    def ext_hook(code: int, data: bytes) -> Any:
        nonlocal left
        if code == _NDARRAY:
            (dtype, shape), offset = _read_header(data, 2)
            dt, shape = _array_type(dtype, shape)
            return np.frombuffer(data, dtype=dt, offset=offset).reshape(shape)
        if code != _COMPRESSED:
            raise CodecError(f"unknown msgpack extension {code}")
        (name, dtype, shape), offset = _read_header(data, 3)
        dt, shape = _array_type(dtype, shape)
        if name != "zstd":
            raise CodecError(f"unknown array compression {name!r:.40}")
        size = dt.itemsize * math.prod(shape)  # Python ints: no overflow however large the shape
        if size > left:
            raise CodecError(f"compressed arrays declare more than the {max_bytes} bytes a message may decode to")
        left -= size
        return np.frombuffer(_zstd_decompress(data[offset:], size), dtype=dt).reshape(shape)

    return ext_hook


def pack(obj: Mapping[str, Any], compress: str = "none", threshold: int = COMPRESS_MIN_BYTES) -> bytes:
    """Encode a map of plain values and numpy arrays. `compress` (COMPRESS_CHOICES): "auto" or "zstd"
    compress arrays of at least `threshold` bytes where that pays; "none" keeps every array raw."""
    return msgpack.packb(obj, default=_encoder(compress, threshold), use_bin_type=True)


def unpack(data: bytes, max_bytes: int = MAX_DECODED_BYTES) -> dict[str, Any]:
    """Decode what `pack` made; raw arrays are read-only views into `data`, compressed ones read-only
    arrays over their decompressed bytes, of at most `max_bytes` in all."""
    try:
        message = msgpack.unpackb(data, ext_hook=_decoder(max_bytes), raw=False, strict_map_key=False)
    except CodecError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: e.g. a map keyed by a list
        # Some msgpack errors (BufferFull) carry no text: name the type and the size at least.
        raise CodecError(f"undecodable payload of {len(data)} bytes: {type(exc).__name__}: {exc}") from None
    if not isinstance(message, dict):  # one flipped bit turns the map into a list or a number
        raise CodecError(f"payload of {len(data)} bytes is a {type(message).__name__}, not a map")
    return message


def array_bytes(obj: Any) -> int:
    """The bytes of all numpy arrays in a message (maps and lists walked): what it decodes to."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, Mapping):
        return sum(array_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(array_bytes(v) for v in obj)
    return 0


# ---- policies ------------------------------------------------------------------------------------


def tensor_digest(state: Mapping[str, Any]) -> str:
    """sha256 over names, dtypes (torch's names), shapes and bytes, in name order: identical weights,
    identical digest, whether they are torch tensors or the numpy arrays a worker reads (decode_policy)."""
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        if isinstance(value, np.ndarray):
            dtype, data = _TORCH_DTYPE_NAMES[value.dtype.name], np.ascontiguousarray(value).tobytes()
        else:
            tensor = value.detach().cpu().contiguous()
            dtype = str(tensor.dtype)
            data = tensor.view(_torch().uint8).numpy().tobytes() if tensor.numel() else b""
        h.update(name.encode())
        h.update(dtype.encode())
        h.update(str(tuple(value.shape)).encode())
        h.update(data)
    return h.hexdigest()


# numpy's dtypes under the names torch gives them (the digest's): a version's tensors read as numpy
# arrays digest as they did as tensors. bfloat16 has no numpy dtype: such blobs are read with torch.
_TORCH_DTYPE_NAMES = {
    name: f"torch.{name}"
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
}


def _torch() -> Any:
    import torch  # here, not at the top: reading a policy's metadata (`rlfarm status`) needs no torch

    return torch


def wire_state(state: Mapping[str, torch.Tensor], dtype: str = "float32") -> dict[str, torch.Tensor]:
    """A network's state as a version carries it (farm.policy_dtype): "float16" rounds float32 tensors
    to half precision, halving what every fetch sends; others (float64 statistics, integers) keep theirs.
    Loading it into a network (load_state_dict) casts back to the network's float32."""
    if dtype == "float32":
        return dict(state)
    if dtype != "float16":
        raise ValueError(f"policy dtype must be float32 or float16, got {dtype!r}")
    import torch

    return {k: v.half() if v.dtype == torch.float32 else v for k, v in state.items()}


def encode_policy(
    state: Mapping[str, torch.Tensor], metadata: Mapping[str, str], secret: bytes | str | None = None
) -> bytes:
    """Safetensors bytes with `metadata` plus the tensors' sha256; with `secret` (rlfarm.core.signing),
    also `hmac` over the signed fields, the sha256 among them (any `hmac` given is replaced)."""
    from safetensors.torch import save as st_save

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta["sha256"] = tensor_digest(tensors)
    if secret is not None:
        meta["hmac"] = signing.policy_hmac(meta, secret)
    return st_save(tensors, metadata=meta)


# Bound on a policy blob's JSON header: a few hundred bytes a tensor, so a network of thousands of
# tensors fits; a forged length beyond it is refused before it is read.
MAX_POLICY_HEADER = 16 * 2**20


def policy_header_size(prefix: bytes) -> int:
    """How many bytes of a safetensors blob hold its header (the length field and the JSON), from its
    first 8 or more bytes: what a reader of a version's metadata alone fetches."""
    try:
        (n,) = struct.unpack("<Q", prefix[:8])
    except struct.error:
        raise CodecError("not a safetensors blob: shorter than its header's length field") from None
    if n > MAX_POLICY_HEADER:
        raise CodecError(f"not a safetensors blob: a header of {n} bytes (at most {MAX_POLICY_HEADER})")
    return 8 + n


def policy_metadata(blob: bytes) -> dict[str, str]:
    """The metadata of a safetensors blob, read from its JSON header without touching the tensors."""
    try:
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + n])
    except (struct.error, ValueError) as exc:
        raise CodecError(f"not a safetensors blob: {exc}") from None
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CodecError("not a safetensors blob: its metadata is not a map of strings")
    return dict(meta)


def decode_policy(
    blob: bytes, secret: bytes | str | None = None, arrays: str = "torch"
) -> tuple[dict[str, Any], dict[str, str]]:
    """Tensors and metadata; raises CodecError when the checksum does not match the tensors, and,
    given a `secret`, when the blob's `hmac` is missing or does not verify (checked before the
    tensors are even parsed: a forged blob with a recomputed sha256 fails here). `arrays="numpy"`:
    numpy arrays instead of torch tensors, without importing torch (a worker acting an MLP), except
    for a dtype numpy has not (bfloat16), read as torch tensors."""
    meta = policy_metadata(blob)
    if secret is not None:
        try:
            signing.verify_policy(meta, secret, "policy blob")
        except signing.SignatureError as exc:
            raise CodecError(str(exc)) from None
    state = _load_arrays(blob, numpy=arrays == "numpy")
    expected = meta.get("sha256")
    if expected is None:
        raise CodecError("policy blob carries no sha256")
    actual = tensor_digest(state)
    if actual != expected:
        raise CodecError(f"policy checksum mismatch: expected {expected[:12]}, got {actual[:12]}")
    return state, meta


def _load_arrays(blob: bytes, numpy: bool) -> dict[str, Any]:
    if numpy:
        from safetensors.numpy import load as np_load

        try:
            return np_load(blob)
        except Exception:  # bfloat16 (numpy has no such dtype), or not safetensors: torch says which
            pass
    from safetensors.torch import load as st_load

    try:
        return st_load(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise CodecError(f"not a safetensors blob: {exc}") from None
