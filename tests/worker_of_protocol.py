"""`python -m tests.worker_of_protocol N ARGS...`: a real `rlfarm worker ARGS` that speaks rlfarm
protocol N, as a worker of another rlfarm version does; everything else is this checkout's."""

import sys

import rlfarm.core.protocol

# Before anything reads them (pool processes fork from here): its version and so its queue.
rlfarm.core.protocol.PROTOCOL = int(sys.argv.pop(1))
rlfarm.core.protocol.TASK_QUEUE = rlfarm.core.protocol.task_queue(rlfarm.core.protocol.PROTOCOL)

import cli  # noqa: E402

if __name__ == "__main__":
    cli.main(prog_name="rlfarm")
