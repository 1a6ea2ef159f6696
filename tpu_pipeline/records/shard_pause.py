"""The one test seam of a conversion: a pause after each finished shard, so a test can act mid-run.

A kill-and-resume test needs a conversion that is still running when it strikes: SHARD_DELAY_ENV
sleeps that many seconds after each shard. A test that must act at a known point (a second convert
refused while the first holds the lock) holds the conversion on a file instead of guessing a sleep:
while SHARD_HOLD_ENV's file exists, each finished shard waits. Neither is set outside tests.
"""
from __future__ import annotations

import os
import time

SHARD_DELAY_ENV = "TPU_PIPELINE_TEST_SHARD_DELAY_S"
SHARD_HOLD_ENV = "TPU_PIPELINE_TEST_SHARD_HOLD"


def pause_after_shard() -> None:
    delay = float(os.environ.get(SHARD_DELAY_ENV, "0") or 0)
    if delay:
        time.sleep(delay)
    hold = os.environ.get(SHARD_HOLD_ENV)
    while hold and os.path.exists(hold):
        time.sleep(0.05)
