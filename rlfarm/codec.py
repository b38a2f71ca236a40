"""Bytes on the wire and in the policy store, without pickle.

- Task results: msgpack maps whose numpy arrays travel as raw buffers (dtype, shape, bytes) in a
  msgpack extension type, decoded zero-copy with `np.frombuffer`.
- Policies: safetensors bytes whose str->str metadata carries version, algo, created and a sha256 of
  the tensors, so a corrupted blob is detected before a worker acts with it; with RLFARM_SECRET set
  also an `hmac` (rlfarm.signing), so a forged one is too.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Mapping

import msgpack
import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlfarm import signing

_NDARRAY = 42  # msgpack extension code for numpy arrays


class CodecError(ValueError):
    """Bytes that do not decode to what they claim to be."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("object arrays cannot be encoded")
        arr = np.ascontiguousarray(obj)
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(_NDARRAY, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _NDARRAY:
        raise CodecError(f"unknown msgpack extension {code}")
    # Only the small header is read here, but msgpack's Unpacker refuses to take in more than its
    # buffer limit (100 MiB by default): size it to the data so any result under the run's limit decodes.
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    dtype, shape = unpacker.unpack()
    offset = unpacker.tell()
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise CodecError("object arrays are refused")
    return np.frombuffer(data, dtype=dt, offset=offset).reshape(shape)


def pack(obj: Mapping[str, Any]) -> bytes:
    """Encode a map of plain values and numpy arrays."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    """Decode what `pack` made; arrays are read-only views into `data`."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        # Some msgpack errors (BufferFull) carry no text: name the type and the size at least.
        raise CodecError(f"undecodable payload of {len(data)} bytes: {type(exc).__name__}: {exc}") from None


# ---- policies ------------------------------------------------------------------------------------

def tensor_digest(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes, in name order: identical weights, identical digest."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def encode_policy(state: Mapping[str, torch.Tensor], metadata: Mapping[str, str],
                  secret: bytes | str | None = None) -> bytes:
    """Safetensors bytes with `metadata` plus the tensors' sha256; with `secret` (rlfarm.signing),
    also `hmac` over the signed fields, the sha256 among them (any `hmac` given is replaced)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta["sha256"] = tensor_digest(tensors)
    if secret is not None:
        meta["hmac"] = signing.policy_hmac(meta, secret)
    return st_save(tensors, metadata=meta)


def policy_metadata(blob: bytes) -> dict[str, str]:
    """The metadata of a safetensors blob, read from its JSON header without touching the tensors."""
    try:
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
    except (struct.error, ValueError) as exc:
        raise CodecError(f"not a safetensors blob: {exc}") from None
    return dict(header.get("__metadata__", {}))


def decode_policy(blob: bytes, secret: bytes | str | None = None
                  ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata; raises CodecError when the checksum does not match the tensors, and,
    given a `secret`, when the blob's `hmac` is missing or does not verify (checked before the
    tensors are even parsed: a forged blob with a recomputed sha256 fails here)."""
    meta = policy_metadata(blob)
    if secret is not None:
        try:
            signing.verify_policy(meta, secret, "policy blob")
        except signing.SignatureError as exc:
            raise CodecError(str(exc)) from None
    try:
        state = st_load(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise CodecError(f"not a safetensors blob: {exc}") from None
    expected = meta.get("sha256")
    if expected is None:
        raise CodecError("policy blob carries no sha256")
    actual = tensor_digest(state)
    if actual != expected:
        raise CodecError(f"policy checksum mismatch: expected {expected[:12]}, got {actual[:12]}")
    return state, meta
