"""The tree passes ruff's lint and is as ruff formats it (pyproject.toml [tool.ruff]): the suite runs
it, so CI (.ci/run, the README's test command) does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.process


def _ruff() -> str:
    found = Path(sys.executable).with_name("ruff")
    if found.exists():
        return str(found)
    which = shutil.which("ruff")
    if which is None:
        pytest.skip("ruff is not installed (the test extra: pip install -e '.[test]')")
    return which


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    result = subprocess.run([_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
