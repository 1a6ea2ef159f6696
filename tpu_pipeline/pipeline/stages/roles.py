"""A pipeline's stages by the roles they declare: its parts (`Parts`), named, split once from the list.

The engine reads a pipeline top to bottom by its parts, the way big_vision's `make_for_train` reads:

    source → once (built once: through the last cache) → epoch (built per epoch)
           → repeat → stream (on the stream of epochs: batch, outputs, service, prefetch, options)

and the stages other code needs by name are named: the `windowed` stage (bucket, pack: the unit
of a resume), the `batch` (the last per-replica batching stage, which gives the global batch), the
`outputs` (the feature dict → Keras's element), the `service` split, `prefetch`, `options`, and
evaluation's `steps`. A stage says which parts it plays by its `roles` (`base.Stage.roles`), never
by its class, so a user's own stage works in any place (with no roles it is a map stage) and one can
declare a role of ours. `split_by_roles` is the one function that reads roles; everything else asks
the parts by name, and rewrites them by name (`replaced`, `inserted`), which splits again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

# The names a stage may declare in its `roles`; a stage with none is a map stage.
CACHE, REPEAT = "cache", "repeat"
NAMED = ("windowed", "batch", "outputs", "service", "prefetch", "options", "steps")
ROLES = (CACHE, REPEAT, *NAMED)


def roles_of(stage: Any) -> tuple[str, ...]:
    """The parts `stage` plays (a stage of no `Stage` subclass, with apply and after only, plays none)."""
    return tuple(getattr(stage, "roles", ()))


@dataclasses.dataclass(frozen=True)
class Parts:
    """The stages in order, with where each part is (indices into `stages`). Build it with `split_by_roles(stages)`."""

    stages: tuple[Any, ...] = ()
    once_end: int = 0  # stages[:once_end] are built once (through the last cache before the repeat)
    repeat_at: Optional[int] = None  # the repeat; without one, every stage belongs to the one epoch
    named: Mapping[str, int] = dataclasses.field(default_factory=dict)  # name (NAMED) → index

    @property
    def once(self) -> tuple[Any, ...]:
        """Built once, in the first epoch: the stages up to and including the last cache before the repeat."""
        return self.stages[:self.once_end]

    @property
    def epoch(self) -> tuple[Any, ...]:
        """Built per epoch (they know it): after the last cache, before the repeat."""
        return self.stages[self.once_end:self._repeat_end()]

    @property
    def repeat(self) -> Any:
        """The repeat (`repeat.Repeat.epochs` makes the stream of epochs), or None: one epoch."""
        return None if self.repeat_at is None else self.stages[self.repeat_at]

    @property
    def stream(self) -> tuple[Any, ...]:
        """After the repeat, on the stream of epochs."""
        return () if self.repeat_at is None else self.stages[self.repeat_at + 1:]

    def _repeat_end(self) -> int:
        return len(self.stages) if self.repeat_at is None else self.repeat_at

    def _named(self, name: str) -> Any:
        at = self.named.get(name)
        return None if at is None else self.stages[at]

    windowed = property(lambda self: self._named("windowed"), doc="The bucket or pack stage, or None.")
    batch = property(lambda self: self._named("batch"), doc="The last per-replica batching stage (Batch, Bucket), or None.")
    outputs = property(lambda self: self._named("outputs"), doc="The outputs (ToOutputs; SplitPosition), or None.")
    service = property(lambda self: self._named("service"), doc="Where the stream leaves for tf.data service workers, or None.")
    prefetch = property(lambda self: self._named("prefetch"), doc="The prefetch, or None.")
    options = property(lambda self: self._named("options"), doc="The tf.data options (the last WithOptions), or None.")
    steps = property(lambda self: self._named("steps"), doc="Evaluation's stage that knows a pass's steps, or None.")

    def until(self, name: str, inclusive: bool = False) -> "Parts":
        """The parts of the stages before the named one (`inclusive`: through it)."""
        return split_by_roles(self.stages[:self.named[name] + (1 if inclusive else 0)])

    def following(self, name: str) -> tuple[Any, ...]:
        """The stages after the named one."""
        return self.stages[self.named[name] + 1:]

    def replaced(self, **stages: Any) -> "Parts":
        """These parts with named stages replaced in place, e.g. `replaced(batch=dataclasses.replace(parts.batch, ...))`."""
        unknown = sorted(set(stages) - set(self.named))
        if unknown:
            raise KeyError(f"no {unknown} in these parts (named: {sorted(self.named)})")
        new = list(self.stages)
        for name, stage in stages.items():
            new[self.named[name]] = stage
        return split_by_roles(new)

    def inserted(self, stage: Any, *, before: Optional[str] = None, after: Optional[str] = None) -> "Parts":
        """These parts with `stage` inserted before or after the named stage; at the end when that is absent."""
        anchor = before or after
        at = self.named.get(anchor) if anchor else None
        at = len(self.stages) if at is None else at + (1 if after else 0)
        return split_by_roles([*self.stages[:at], stage, *self.stages[at:]])


def split_by_roles(stages: Sequence[Any]) -> Parts:
    """The parts of `stages`, by the roles each declares: the first repeat cuts the epoch from the
    stream, the last cache before it ends what is built once; each named part is the first stage
    with that role, but the batch is the last per-replica one and the options the last."""
    stages = tuple(stages)
    for stage in stages:
        if not (callable(getattr(stage, "apply", None)) and callable(getattr(stage, "after", None))):
            raise TypeError(f"{stage!r} is not a stage: a stage has apply(dataset, context) and after(context); "
                            "subclass tpu_pipeline.pipeline.stages.base.Stage")
    roles = [roles_of(stage) for stage in stages]
    unknown = {name for played in roles for name in played} - set(ROLES)
    if unknown:
        raise ValueError(f"unknown stage roles {sorted(unknown)}; a stage's roles are among {list(ROLES)}")
    repeat_at = next((i for i, played in enumerate(roles) if REPEAT in played), None)
    before = len(stages) if repeat_at is None else repeat_at
    once_end = max((i + 1 for i, played in enumerate(roles[:before]) if CACHE in played), default=0)
    named: dict[str, int] = {}
    for index, (stage, played) in enumerate(zip(stages, roles)):
        for name in (name for name in played if name in NAMED):
            if name == "batch" and not getattr(stage, "per_replica", True):
                continue  # a batch of records (data.sequence's windows) is not the step's batch
            if name in ("batch", "options") or name not in named:
                named[name] = index
    return Parts(stages, once_end, repeat_at, named)
