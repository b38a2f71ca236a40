"""A run directory that becomes read-only or full mid-run: one line naming the path and the error,
the last checkpoint whole, CSV files of whole rows only, and `rlfarm train --resume` carries on once
the disk has room again. The faults are real: the directory's write permission taken away (as root,
from a trainer without CAP_DAC_OVERRIDE, via setpriv), and a small tmpfs filled to the last byte."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rlfarm.trainer import resume as checkpoint

from .conftest import WORKER_ENV, one_error_line, poll, read_csv, read_summary, rlfarm_cmd, run_cli

pytestmark = [pytest.mark.farm, pytest.mark.fault]

# 2 ms per env step, 500 steps an iteration: a few iterations a second, a checkpoint at each.
RUN = [
    "--preset",
    "cartpole-ppo",
    "--env",
    "tests.tiny_envs:slow",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "farm.steps_per_env=250",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "checkpoint_interval=0",
    "--set",
    "eval.interval=0",
    "--set",
    "target_return=inf",
]
TOTAL = 12000
CSV_FILES = ["progress.csv", "episodes.csv"]


def without_dac_override() -> list[str]:
    """argv prefix under which root, too, is refused writes by a directory's permissions."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("as root this test needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def start(run_dir: Path, farm, prefix: list[str] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *prefix,
            *rlfarm_cmd(
                "train",
                "--redis",
                farm.redis_url,
                "--run-id",
                run_dir.name,
                "--logdir",
                str(run_dir.parent),
                *RUN,
                "--total-steps",
                str(TOTAL),
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **WORKER_ENV},
    )


def checkpoint_steps(run_dir: Path) -> int:
    if not checkpoint.path_in(run_dir).exists():
        return 0
    return checkpoint.load(run_dir)[1]["env_steps"]


def assert_whole_rows(run_dir: Path) -> None:
    for name in CSV_FILES:
        text = (run_dir / name).read_text()
        assert text.endswith("\n"), f"{name} ends mid-row: {text[-80:]!r}"
        lines = text.splitlines()
        widths = {len(line.split(",")) for line in lines}
        assert widths == {len(lines[0].split(","))}, f"{name} has rows of other widths: {widths}"


def assert_resumes(run_dir: Path, farm) -> None:
    resumed = run_cli("train", "--resume", run_dir.name, "--logdir", str(run_dir.parent), "--redis", farm.redis_url)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_summary(run_dir)["env_steps"] == TOTAL
    steps = [int(r["global_step"]) for r in read_csv(run_dir / "progress.csv")]
    assert steps == sorted(set(steps)), f"progress.csv repeats or reorders steps after the resume: {steps}"
    assert_whole_rows(run_dir)


def test_run_directory_made_read_only_mid_run(farm, tmp_path):
    run_dir = tmp_path / "readonly"
    proc = start(run_dir, farm, without_dac_override())
    poll(lambda: checkpoint_steps(run_dir) >= 1000, "a checkpoint past 1000 env steps", proc)
    run_dir.chmod(0o555)
    try:
        _, stderr = proc.communicate(timeout=600)
    finally:
        run_dir.chmod(0o755)
    assert proc.returncode == 1, stderr[-3000:]
    line = one_error_line(stderr)
    assert f"cannot write {run_dir}/" in line and "Permission denied" in line, line
    assert f"rlfarm train --resume {run_dir.name}" in line
    assert "Traceback" not in stderr
    assert checkpoint_steps(run_dir) >= 1000  # the last one written is whole
    assert not list(run_dir.glob("*.tmp"))
    assert_whole_rows(run_dir)
    assert_resumes(run_dir, farm)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs of its own: filling it fills nothing else."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs needs root with CAP_SYS_ADMIN: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write zeros until the filesystem refuses: ENOSPC for the next writer."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = bytes(1 << 16)
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:  # the last few bytes, so that even a small row finds no room
                f.write(b"\0")
        except OSError:
            pass
    return filler


def test_run_directory_on_a_full_disk(farm, small_disk):
    run_dir = small_disk / "full"
    proc = start(run_dir, farm)
    poll(lambda: checkpoint_steps(run_dir) >= 1000, "a checkpoint past 1000 env steps", proc)
    filler = fill(small_disk)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-3000:]
    line = one_error_line(stderr)
    assert f"cannot write {run_dir}/" in line and "No space left on device" in line, line
    assert "Traceback" not in stderr and "ENOSPC" not in stderr.replace(line, "")
    assert checkpoint_steps(run_dir) >= 1000
    assert_whole_rows(run_dir)
    filler.unlink()
    assert_resumes(run_dir, farm)
