"""Trainer checkpoints, for `rlfarm train --resume`: what it takes to continue a run whose trainer died.

One safetensors file in the run directory. Its tensors: network(s), optimizer moments, torch RNG
states, the replay buffer; its metadata: one JSON document with everything else (counters, optimizer
hyper-parameters, numpy generator states, logger state). No pickle: loading it runs no code.
It is written to a temporary file and renamed (rlfarm.runio.rundir.write_atomic), so a trainer killed
mid-write, or a disk that fills up, leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfarm.errors import CheckpointError
from rlfarm.runio.rundir import write_atomic

if TYPE_CHECKING:
    import torch

FILENAME = "checkpoint.safetensors"
FORMAT = "rlfarm-trainer-checkpoint/2"  # 2: the algorithm owns its replay buffer


def path_in(run_dir: Path) -> Path:
    return Path(run_dir) / FILENAME


def save(run_dir: Path, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> Path:
    # Imported here, not at the top: it imports torch (seconds of CPU), which `path_in` does not need,
    # and `rlfarm train` refuses bad input before paying for it.
    from safetensors.torch import save as st_save

    # safetensors refuses shared or strided storage; copies are cheap at these sizes.
    plain = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    blob = st_save(plain, metadata={"format": FORMAT, "state": json.dumps(state)})
    return write_atomic(path_in(run_dir), blob)


def saved_steps(run_dir: Path) -> int | None:
    """The env steps the run's checkpoint holds, read from its header alone (no torch); None without one."""
    try:
        with open(path_in(run_dir), "rb") as f:
            header = f.read(int.from_bytes(f.read(8), "little"))
        return int(json.loads(json.loads(header)["__metadata__"]["state"])["env_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors.torch import load as st_load

    path = path_in(run_dir)
    if not path.exists():
        raise CheckpointError(f"{run_dir} has no trainer checkpoint ({FILENAME}); nothing to resume")
    blob = path.read_bytes()
    try:
        header_len = int.from_bytes(blob[:8], "little")
        metadata = json.loads(blob[8 : 8 + header_len]).get("__metadata__", {})
        if metadata.get("format") != FORMAT:
            raise CheckpointError(f"{path} is not an rlfarm trainer checkpoint ({metadata.get('format')})")
        return st_load(blob), json.loads(metadata["state"])
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from None
