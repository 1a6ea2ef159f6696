"""A child for tests/test_fork_server.py: prints what a process knows of how it was started, as JSON.

    fork_echo_child.py EXIT_CODE [sleep]   # `sleep`: wait to be killed after printing
"""
from __future__ import annotations

import json
import os
import sys
import time

print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(), "path0": sys.path[0],
    "env": os.environ.get("FORK_ECHO"), "hash": hash("tpu_pipeline"), "main": __name__,
    "tensorflow_before": "tensorflow" in sys.modules, "stdin": sys.stdin.readline().strip(),
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[2:] == ["sleep"]:
    time.sleep(600)
sys.exit(int(sys.argv[1]))
