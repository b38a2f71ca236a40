"""What the forkserver of tests/cli_fork.py imports before it forks a command: what `rlfarm train`
and the other commands import on their way. Imports only: nothing here may start a thread or run a
torch op, since every command is forked from this state."""

import celery  # noqa: F401
import gymnasium  # noqa: F401
import numpy  # noqa: F401
import redis  # noqa: F401
import torch  # noqa: F401
import torch.utils.tensorboard  # noqa: F401

import rlfarm.algos  # noqa: F401
import rlfarm.api  # noqa: F401
import rlfarm.cli  # noqa: F401
import rlfarm.trainer  # noqa: F401
