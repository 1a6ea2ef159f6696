"""A finding of the doctor: a problem, in one line, and the config changes that fix it."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Finding:
    problem: str
    overrides: tuple[str, ...]  # the key=value changes that fix it
