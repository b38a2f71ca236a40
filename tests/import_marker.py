"""A module that must never be imported by a worker: importing it leaves a marker file.

tests/test_signing.py names it in a run's metadata (`tests.import_marker:make`) and checks that a
worker refused the env without importing it (the marker does not exist afterwards).
"""

import os
import tempfile
from pathlib import Path

MARKER = Path(tempfile.gettempdir()) / f"rlfarm-import-marker-{os.getuid()}"
MARKER.write_text(f"imported by pid {os.getpid()}\n")


def make():
    raise RuntimeError("tests.import_marker:make was called")
