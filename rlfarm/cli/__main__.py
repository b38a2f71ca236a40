"""`python -m rlfarm.cli ...`: the `rlfarm` command (how a sweep or `train --seeds` starts its trainers)."""

from rlfarm.cli import entry

if __name__ == "__main__":
    entry()
