"""`tpu-pipeline serve dispatcher|worker [--port N] ...`: run a tf.data service server until SIGTERM.

  tpu-pipeline serve dispatcher --port 5050 [--work_dir gs://bucket/dispatcher]
  tpu-pipeline serve worker --dispatcher dispatcher-host:5050 [--port 5051] [--address this-host]

Trainers then read through it: `tpu-pipeline train data.service.address=grpc://dispatcher-host:5050`.
The servers listen on every interface and have no authentication: keep them on a private network.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from absl import flags

from tpu_pipeline.errors import ConfigError

flags.DEFINE_integer("port", None, "port to serve on (dispatcher default 5050; worker default: any free port)")
flags.DEFINE_string("work_dir", None, "dispatcher: a directory (local or gs://) where it journals its state, so a "
                    "restarted dispatcher resumes its jobs (fault-tolerant mode)")
flags.DEFINE_float("worker_timeout", 10.0, "dispatcher: seconds without a heartbeat before a worker counts as gone")
flags.DEFINE_string("dispatcher", None, "worker: the dispatcher's host:port (or grpc://host:port)")
flags.DEFINE_string("address", None, "worker: the host name trainers reach this worker at (default localhost, "
                    "i.e. trainers on this machine only)")
FLAGS = flags.FLAGS

ROLES = ("dispatcher", "worker")
DISPATCHER_PORT = 5050


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.service import serve_until_stopped, start_dispatcher, start_worker

    if len(overrides) != 1 or overrides[0] not in ROLES:
        raise ConfigError(f"name one role, dispatcher or worker (got {' '.join(overrides) or 'none'}), "
                          "e.g. `tpu-pipeline serve dispatcher --port 5050`")
    role = overrides[0]
    if role == "dispatcher":
        if FLAGS.dispatcher or FLAGS.address:
            raise ConfigError("dispatcher: --dispatcher and --address are worker flags")
        running = start_dispatcher(DISPATCHER_PORT if FLAGS.port is None else FLAGS.port, FLAGS.work_dir,
                                   worker_timeout_ms=int(FLAGS.worker_timeout * 1000))
    else:
        if not FLAGS.dispatcher:
            raise ConfigError("worker: --dispatcher is required, e.g. --dispatcher dispatcher-host:5050")
        if FLAGS.work_dir:
            raise ConfigError("worker: --work_dir is a dispatcher flag (workers keep no state)")
        running = start_worker(FLAGS.dispatcher, FLAGS.port or 0, FLAGS.address)

    def say(line: str) -> None:
        print(f"tpu-pipeline serve: {line}", flush=True)

    if not serve_until_stopped(running, say):
        sys.stdout.flush()
        os._exit(0)  # a worker: TF's own stop would join its busy tasks for tens of seconds, holding the GIL
    return 0
