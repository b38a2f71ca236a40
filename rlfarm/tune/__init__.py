"""Several runs as one command, I/O: `rlfarm train --seeds` and `rlfarm sweep` (Optuna), each run a
trainer subprocess on one farm."""
