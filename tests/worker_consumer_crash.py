"""`python -m tests.worker_consumer_crash MARKER ARGS...`: a real `rlfarm worker ARGS` whose first
acknowledgement on the machine (the marker file) raises the AttributeError a broker connection torn
down half-way raised in kombu's Redis transport during a Sentinel failover (issue 50), in the
consumer's event loop, where Celery takes it for an unrecoverable error. Everything else is this
checkout's, and a worker that starts again (exec) is a plain `rlfarm worker`."""

import os
import sys

from kombu.transport import redis as kombu_redis

MARKER = sys.argv.pop(1)
_ack = kombu_redis.Channel.basic_ack


def basic_ack(self, delivery_tag, multiple=False):
    try:
        os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return _ack(self, delivery_tag, multiple)
    raise AttributeError("'NoneType' object has no attribute 'hostname'")


kombu_redis.Channel.basic_ack = basic_ack

import cli  # noqa: E402

if __name__ == "__main__":
    cli.main(prog_name="rlfarm")
