"""`rlfarm`: the command, run from a checkout (`python cli.py ...`); it is rlfarm.cli."""

from rlfarm.cli import entry, main

__all__ = ["entry", "main"]

if __name__ == "__main__":
    entry()
