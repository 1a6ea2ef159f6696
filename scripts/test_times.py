"""Where the suite's time goes, from a `pytest --durations=0` log (scripts/test_times.sh writes one).

    python scripts/test_times.py LOG [--slow-ids FILE] [--top 40]

Prints the slowest tests (setup, call and teardown added up), the total per file, and the split of the
time into fixture setup, the tests' own calls and teardown, in-process tests against those marked slow
(child processes), so the next person sees what to make cheaper (docs/testing.md).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

LINE = re.compile(r"^\s*(?P<seconds>[0-9.]+)s (?P<phase>setup|call|teardown)\s+(?P<nodeid>\S.*?)\s*$")
SUMMARY = re.compile(r"^=*\s*(?P<text>\d+ passed.*) in (?P<seconds>[0-9.]+)s")


def read(log: str) -> tuple[dict[str, dict[str, float]], str]:
    """Seconds per test and phase, and pytest's closing line."""
    times: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    closing = ""
    with open(log, errors="replace") as handle:
        for line in handle:
            match = LINE.match(line)
            if match:
                times[match["nodeid"]][match["phase"]] += float(match["seconds"])
            elif SUMMARY.match(line.strip()):
                closing = line.strip().strip("= ")
    return times, closing


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--slow-ids", help="a file of the node ids marked slow (pytest --collect-only -q -m slow)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    times, closing = read(args.log)
    if not times:
        print(f"{args.log}: no durations in it; run pytest with --durations=0", file=sys.stderr)
        return 2
    slow = set()
    if args.slow_ids:
        slow = {line.strip() for line in open(args.slow_ids) if "::" in line}
    total = {nodeid: sum(phases.values()) for nodeid, phases in times.items()}
    print(f"{closing or 'pytest closing line not found'}; {len(times)} tests timed")
    print(f"\nThe {args.top} slowest tests (setup + call + teardown, seconds; 's' = marked slow):")
    for nodeid, seconds in sorted(total.items(), key=lambda kv: -kv[1])[:args.top]:
        phases = times[nodeid]
        flag = "s" if nodeid in slow else " "
        print(f"{seconds:8.1f} {flag} setup {phases['setup']:6.1f} call {phases['call']:7.1f}  {nodeid}")
    per_file: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for nodeid, seconds in total.items():
        per_file[nodeid.split("::")[0]] += seconds
        count[nodeid.split("::")[0]] += 1
    print("\nPer file (seconds, tests):")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f} {count[name]:4d}  {name}")
    phase_sums = {phase: sum(p[phase] for p in times.values()) for phase in ("setup", "call", "teardown")}
    everything = sum(phase_sums.values())
    print(f"\nAll tests' time added up (both workers): {minutes(everything)}")
    for phase, seconds in phase_sums.items():
        print(f"  {phase:9s}{minutes(seconds)}  {100 * seconds / everything:5.1f}%"
              + ("  (fixtures: data sets converted, models built, servers started)" if phase == "setup" else ""))
    if slow:
        slow_seconds = sum(seconds for nodeid, seconds in total.items() if nodeid in slow)
        print(f"  marked slow (child processes, servers): {minutes(slow_seconds)}  "
              f"{100 * slow_seconds / everything:5.1f}% in {len(slow & set(total))} tests")
        print(f"  in-process: {minutes(everything - slow_seconds)}  {100 * (everything - slow_seconds) / everything:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
