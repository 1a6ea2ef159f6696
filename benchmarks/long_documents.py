"""Corpora of long documents for the row-shuffle and memory benchmarks, converted once by the real
`tpu-pipeline convert --from text` (byte-level) under $TPU_PIPELINE_CACHE/bench/<name>:

  stdlib_docs   every .py file of this Python's standard library (no test/, tests/ or site-packages:
                ~670 files, ~12 MB, the largest a few hundred KB): source code nobody here wrote,
                one document per file
  one_30mb      one 30 MB document: the standard library's files concatenated and repeated
  corpus_10mb   the first ~10 MB of stdlib_docs's files, one document per file

Generated data is never committed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import bench_dir  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stdlib_sources() -> list[str]:
    """The standard library's .py files, sorted (no tests, no site-packages)."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "test", "tests"}
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in skip and not d.startswith("__pycache__"))
        found += [os.path.join(directory, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _documents(name: str) -> list[bytes]:
    sources = [open(path, "rb").read() for path in stdlib_sources()]
    if name == "stdlib_docs":
        return sources
    if name == "corpus_10mb":
        kept, total = [], 0
        for text in sources:
            if total >= 10 << 20:
                break
            kept.append(text)
            total += len(text)
        return kept
    if name == "one_30mb":
        blob = b"".join(sources)
        return [(blob * (1 + (30 << 20) // len(blob)))[: 30 << 20]]
    raise ValueError(name)


def corpus(name: str) -> str:
    """The converted dataset directory of `name`, converted on first use."""
    out = os.path.join(bench_dir(), name)
    if os.path.exists(os.path.join(out, "metadata.json")):
        return out
    with tempfile.TemporaryDirectory() as texts:
        for number, text in enumerate(_documents(name)):
            with open(os.path.join(texts, f"doc{number:05d}.txt"), "wb") as f:
                f.write(text.decode("utf-8", "replace").encode("utf-8"))
        cli = os.path.join(os.path.dirname(sys.executable), "tpu-pipeline")
        subprocess.run([cli, "convert", "--from", "text", texts, "--out", out, "--splits", "train", "--noprogress"],
                       check=True, cwd=REPO)
    return out


if __name__ == "__main__":
    for name in sys.argv[1:] or ("stdlib_docs", "corpus_10mb", "one_30mb"):
        print(name, corpus(name))
