"""A sequence mode (data.sequence.mode: pad, bucket, pack) as one object that owns its decisions.

Why objects: each mode decides how it is planned (windows, pools, parse blocks), which op and stages it
adds to a pipeline, what one batch row is, which per-token weights the model needs, whether a batch's
length varies, and how an exact evaluation pads. Held in one class per mode, no other module compares
mode names (tests/test_sequence_modes.py checks it), and a new mode is one module in this package plus
one line in `registry.MODES` (and its name in `config/sequence.py`: the config layer validates a config
without TensorFlow, so the name and its keys' checks live there).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar

import tensorflow as tf

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.sequence import SequenceConfig
from tpu_pipeline.pipeline.sequences.sequence_plan import FilesBytes, SequencePlan
from tpu_pipeline.pipeline.sources.base import Source
from tpu_pipeline.pipeline.stages.batching import Batch
from tpu_pipeline.pipeline.stages.evaluation import padded_evaluation

CUT = {"split": "longer examples cut into chunks of the length, each its own segment",
       "truncate": "longer examples keep their first length tokens",
       "error": "a longer example stops the pipeline"}


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What planning a mode reads: the data section, its config key, and the source and files."""

    config: DataConfig
    prefix: str  # the section: data or eval_data
    source: Source
    files: tuple[str, ...]
    files_bytes: FilesBytes

    @property
    def key(self) -> str:
        return f"{self.prefix}.sequence"

    @property
    def sequence(self) -> SequenceConfig:
        return self.config.sequence

    def cut(self) -> str:
        """What happens to a longer example, in words, with `(overflow auto)` when auto chose."""
        return CUT[self.sequence.resolved_overflow()] + (" (overflow auto)" if self.sequence.overflow == "auto" else "")


class SequenceMode(abc.ABC):
    """One data.sequence mode. Subclasses set the class attributes and implement `plan` and `stages`."""

    name: ClassVar[str]
    weights_key: ClassVar[str] = "targets_mask"  # per-token weights of an lm_shift stream's targets
    length_varies: ClassVar[bool] = False  # batches of different lengths (one compile per length)
    row_name: ClassVar[str] = ""  # what a batch row is when not an example (bench's wording), e.g. "packed rows"
    # The windowed stage's outputs (bucket, pack): whole batches (bucket), or what a batch is made of, and
    # their name in the line that says when new mixture weights take effect.
    windowed_outputs_are_batches: ClassVar[bool] = False
    windowed_output: ClassVar[str] = "output"
    # The doctor's advice on raising the share of slots that hold tokens:
    packs_denser: ClassVar[bool] = True  # packing would fill more of the slots than this mode
    shorter_length_helps: ClassVar[bool] = False  # a shorter length (pad: examples cut) fills more
    wider_window_helps: ClassVar[bool] = False  # a wider window (pack: more items to choose from) fills more
    places_rows: ClassVar[bool] = False  # rows placed by the packer (placement.py): its cost depends on the build

    def example_in_one_row(self, overflow: str) -> bool:
        """Whether every example fills at most one batch row, so a row holds at least one (bucket: no, a
        bucket's batch may be filler; pack: only where no example is split across rows)."""
        return True

    @abc.abstractmethod
    def plan(self, request: PlanRequest) -> tuple[SequencePlan, str]:
        """The mode's plan, every `auto` resolved, and why (one line for `demo --explain` and doctor)."""

    def parse_block(self, sequence: SequencePlan) -> int:
        """Records parsed together on the batched path (0: the per-replica batch)."""
        return 0

    def ops(self, sequence: SequencePlan, batched: bool) -> tuple[list[Callable], list[bool]]:
        """Ops appended to the map that parses (no element crosses threads for them), with their random flags."""
        return [], []

    @abc.abstractmethod
    def stages(self, sequence: SequencePlan, batch: Batch, num_parallel_calls: Any, batched: bool,
               seed: int) -> list[Any]:
        """The stages after the parsing map: the batch (unless made before), or the mode's own."""

    def regroups_on_another_slice(self, bucket_batch: str) -> bool:
        """Whether a saved place converts to another number of replicas or hosts (the global batch kept): a
        window's outputs are then the same groups of the global batch, each step one group, cut into the
        replicas' batches. The place's outputs delivered become groups delivered × the new replicas
        (`regrouped_skip`); a mode without it resumes only on as many hosts, and keeps its rows per step."""
        return False

    def groups_change_with_the_slice(self, bucket_batch: str) -> bool:
        """Whether a regrouping mode's groups of a window differ with the replicas (then a resume on another slice
        skips the examples the old groups covered, `dealt.bucket_examples_delivered`, not whole groups)."""
        return False

    def deals_rows_on_another_slice(self) -> bool:
        """Whether a checkpoint of another number of hosts goes on by dealing the rows its hosts had left
        (`core.row_remainder`): pack, whose rows each host makes from its own stream."""
        return False

    def shares_stream(self, context: tf.distribute.InputContext) -> bool:
        """Whether every input pipeline must read the whole stream (each host keeping its own batches)."""
        return False

    def evaluation(self, pipeline: Any) -> Any:
        """`pipeline` rewritten for exact evaluation: every example once, static shapes."""
        return padded_evaluation(pipeline)

    def fraction(self, lengths: list[int], sequence: SequencePlan, batch_size: int, length: int) -> float:
        """The share of token slots that hold tokens on examples of `lengths` (the doctor's estimate)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name
