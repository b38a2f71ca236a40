"""`python -m tests.worker_of_protocol N ARGS...`: a real `rlfarm worker ARGS` that speaks rlfarm
protocol N, as a worker of another rlfarm version does; everything else is this checkout's."""

import sys

import rlfarm.core.protocol

rlfarm.core.protocol.PROTOCOL = int(sys.argv.pop(1))  # before anything reads it: pool processes fork from here

import cli  # noqa: E402

if __name__ == "__main__":
    cli.main(prog_name="rlfarm")
