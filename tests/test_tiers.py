"""The quick tier works as typed: `python -m pytest -m unit` needs no system package, and a test that
needs one it lacks fails in one line naming it, which survives the parallel runner (issue 51: the unit
tier ended in an INTERNALERROR on a machine without redis-sentinel, the cause hidden)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.process


def _pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)  # a PATH with no redis-sentinel (nor anything else)
    env = {**os.environ, "PATH": str(empty)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_unit_tier_runs_without_system_packages_and_a_farm_test_names_what_it_lacks(tmp_path):
    unit = _pytest(tmp_path, "-m", "unit", "tests/test_sentinel.py")
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr[-2000:]
    assert "passed" in unit.stdout and "INTERNALERROR" not in unit.stdout + unit.stderr
    farm = _pytest(tmp_path, "tests/test_sentinel.py", "-k", "status_and_flower_follow")
    out = farm.stdout + farm.stderr
    assert farm.returncode == 1 and "INTERNALERROR" not in out, out[-3000:]
    assert "missing system packages: redis-sentinel. On Debian/Ubuntu: sudo apt-get install" in out


@pytest.mark.unit
def test_a_unit_test_that_starts_a_process_fails_but_matplotlibs_font_cache_may_be_built():
    """The unit tier's guard (conftest): any process a unit test starts fails it, except fc-list, which
    matplotlib runs once per user to build its font cache (on a fresh machine the plot tests of the
    quick tier failed on it, issue 51's walk as a user with sudo)."""
    from .conftest import StartedAProcess

    with pytest.raises(StartedAProcess):
        subprocess.Popen(["true"])
    with pytest.raises(StartedAProcess):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(StartedAProcess):
        os.system("true")
    try:
        proc = subprocess.Popen(["fc-list", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:  # no fontconfig here: matplotlib then builds its cache without it
        return
    assert proc.wait(timeout=60) == 0
