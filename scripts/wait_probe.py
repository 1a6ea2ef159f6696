"""Which tests wait instead of work: each test's wall time beside the CPU its process spent (issue 46).

A test whose wall time far exceeds its CPU time is waiting: on a child process, a sleep, a timeout, or
TensorFlow (the distributed iterator whose deletion waited minutes was found this way:
docs/testing.md, "Fourth pass"). As a pytest plugin it writes one JSON line per test and worker; run as
a script it prints the totals and the tests that waited longest.

    PYTHONPATH=scripts .venv/bin/python -m pytest -q -n 2 --dist loadgroup -m "not slow" -p wait_probe
    python scripts/wait_probe.py [OUT_PREFIX] [--top 30]

CPU is the test process's own (all its threads) plus that of the children it waited for. Children that
`tests/fork_server.py` forks are the server's, not the test's, so a test that mostly waits on them shows
as waiting: read those with `TPU_PIPELINE_TEST_FORK_SERVER=0`.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import time

OUT = os.environ.get("WAIT_PROBE_OUT", "/tmp/wait_probe")


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


try:
    import pytest
except ImportError:  # the report needs no pytest
    pytest = None

if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):  # noqa: D103 - a pytest hook
        (own0, children0), start = _cpu(), time.time()
        yield
        (own1, children1), end = _cpu(), time.time()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{OUT}.{worker}.jsonl", "a") as out:
            out.write(json.dumps({"id": item.nodeid, "worker": worker, "wall": end - start, "cpu": own1 - own0,
                                  "child_cpu": children1 - children0}) + "\n")


def report(prefix: str, top: int) -> None:
    records = [json.loads(line) for path in sorted(glob.glob(prefix + ".*.jsonl")) for line in open(path)]
    by_worker = collections.defaultdict(list)
    for record in records:
        by_worker[record["worker"]].append(record)
    for worker, done in sorted(by_worker.items()):
        print(f"{worker}: {len(done)} tests, wall {sum(r['wall'] for r in done) / 60:.1f} min, CPU "
              f"{sum(r['cpu'] for r in done) / 60:.1f} min own + {sum(r['child_cpu'] for r in done) / 60:.1f} children")
    def waited(record: dict) -> float:
        return record["wall"] - record["cpu"] - record["child_cpu"]
    print(f"waiting (wall less CPU), all tests: {sum(max(0.0, waited(r)) for r in records) / 60:.1f} min")
    print(f"{'wall s':>7} {'cpu s':>7} {'child':>6}  test")
    for record in sorted(records, key=waited, reverse=True)[:top]:
        print(f"{record['wall']:7.1f} {record['cpu']:7.1f} {record['child_cpu']:6.1f}  {record['id']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", nargs="?", default=OUT)
    parser.add_argument("--top", type=int, default=30)
    arguments = parser.parse_args()
    report(arguments.prefix, arguments.top)
