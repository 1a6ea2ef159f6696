"""Prints the package's dependencies from setup.cfg, one a line, for installs that keep TensorFlow apart.

setup.cfg is the one list. A TPU environment must hold exactly one TensorFlow distribution
(`tensorflow-tpu`, or the one a `tpu-vm-tf-*` image carries), so `pip install -e .` cannot be used
there: it would add the registry's `tensorflow` beside it. This prints everything else, so that
`pip install $(python scripts/deps.py --extras test)` installs the rest around the TPU TensorFlow.

    python scripts/deps.py                      # install_requires without tensorflow and tf-keras
    python scripts/deps.py --extras test,text   # plus those extras
    python scripts/deps.py --tensorflow         # only the TensorFlow family lines (for checks)
"""
from __future__ import annotations

import argparse
import configparser
import os
import re
from typing import Iterable

SETUP_CFG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "setup.cfg")
# The distributions that are, or pull in, the plain `tensorflow` wheel (tf-keras requires it).
TENSORFLOW_FAMILY = ("tensorflow", "tf-keras")
# Printed after setup.cfg's lines: what keeps the rest importable beside an older TensorFlow.
# tensorflow-tpu 2.19 caps protobuf below 6, but tensorflow-metadata 1.21 (tensorflow-datasets' dependency)
# was generated with protobuf 6.31 while declaring protobuf>=4.25.2, so `import tensorflow_datasets` fails
# ("Detected incompatible Protobuf Gencode/Runtime versions"); 1.17.x imports with protobuf 5 and newer.
COMPATIBILITY_PINS = ("tensorflow-metadata<1.18",)


def _lines(value: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in value.splitlines() if line.split("#", 1)[0].strip()]


def project_name(requirement: str) -> str:
    """`tf-keras>=2.16` -> `tf-keras` (normalized as pip does: lower case, `_`/`.` as `-`)."""
    name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: Iterable[str] = (), setup_cfg: str = SETUP_CFG) -> list[str]:
    """install_requires plus the named extras, in setup.cfg's order, without duplicates."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    lines = _lines(parser["options"]["install_requires"])
    for extra in extras:
        if extra not in parser["options.extras_require"]:
            raise SystemExit(f"scripts/deps.py: setup.cfg has no extra {extra!r} "
                             f"(it has: {', '.join(parser['options.extras_require'])})")
        lines += _lines(parser["options.extras_require"][extra])
    seen, unique = set(), []
    for line in lines:
        if project_name(line) not in seen:
            seen.add(project_name(line))
            unique.append(line)
    return unique


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="comma-separated extras of setup.cfg to add")
    parser.add_argument("--tensorflow", action="store_true", help="print only the TensorFlow family lines")
    args = parser.parse_args()
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    for line in requirements(extras):
        if (project_name(line) in TENSORFLOW_FAMILY) == args.tensorflow:
            print(line)
    if not args.tensorflow:
        for line in COMPATIBILITY_PINS:
            print(line)


if __name__ == "__main__":
    main()
