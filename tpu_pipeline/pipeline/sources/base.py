"""The Source protocol every pipeline reads from, and ReadOptions, the read knobs passed whole.

A source says what it is (`yields_records`: serialized tf.Examples that the pipeline must parse,
or finished feature dicts), which files it reads, and what it knows before reading (`info()`).
`build(context, epoch)` makes one epoch's dataset for one input pipeline. The plan
(tpu_pipeline.pipeline.plan) decides the read options once and hands them over with `with_read`,
the way TFDS passes one `ReadConfig` whole instead of a dozen loose arguments.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Union

import tensorflow as tf

from tpu_pipeline.format import DatasetInfo
from tpu_pipeline.pipeline.core.tuning import read_buffer


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How a source reads its files, resolved (no 'auto' left that the plan decides)."""

    seed: int = 0  # the seed tree's root (tpu_pipeline.pipeline.core.seeds): file order of each epoch
    shuffle_files: bool = True
    sharding: str = "auto"  # auto | balanced | file | element | off
    cycle_length: Union[int, str] = 16  # files read at once (an int, or 'autotune')
    block_length: int = 1
    num_parallel_calls: Union[int, str] = "autotune"  # parallel readers; 0 reads in the consumer's thread
    deterministic: Optional[bool] = None  # the interleave's order; None: the pipeline's order
    buffer_size: Union[int, str] = "auto"  # read buffer per file in bytes; auto: by local or remote path
    record_block: int = 0  # records per interleave element (0: single records)
    keep_blocks: bool = False  # with record_block: yield the blocks (for WindowShuffle or Batch(records=True))
    # Hold what the interleave yields in memory after the first epoch (a mixture: each source's records, all of
    # them, read once; every epoch then takes its share from memory, the same stream as from the files).
    cache_records: bool = False
    cover_all: bool = False  # balanced shares of every record, uneven by one (evaluation): none left out

    def buffer_bytes(self, path: str) -> int:
        """The read buffer for `path`: buffer_size, or by default large for remote files, TF's size for local."""
        return read_buffer(self.buffer_size, path)


class Source:
    """Base of every source. Subclasses implement `build`; the rest has the defaults of a source of
    finished feature dicts that knows nothing ahead of reading."""

    yields_records: ClassVar[bool] = False  # serialized tf.Example records that need parsing
    in_memory: ClassVar[bool] = False  # its data lives in this process (tf.data service workers cannot read it)
    # True: `build_from(context, n)` starts the stream after its first n elements by itself, and the source
    # has no epochs of its own for the pipeline to repeat (a mixture: each of its sources has its own).
    seekable: ClassVar[bool] = False
    compression: str = ""

    def tfrecord_files(self) -> list[str]:
        """The TFRecord files this source reads (all input pipelines together); [] when none."""
        return []

    def info(self) -> DatasetInfo:
        """What is known without reading: example count, class names, feature spec (None/{} if not)."""
        return DatasetInfo(None, None, {})

    def count_examples(self) -> Optional[int]:
        """The exact number of examples (all input pipelines), reading the data only when it must;
        None when this source cannot tell."""
        return self.info().num_examples

    def epoch_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        """Elements this input pipeline yields in every epoch, the same each epoch; None when unknown
        or varying. With it, a position in the stream is (epoch, offset): a resume can start there."""
        return None

    def with_read(self, read: ReadOptions) -> "Source":
        """This source reading with `read` (sources that read no files ignore it)."""
        return self

    @property
    def per_epoch(self) -> bool:
        """True: `build(context, epoch)` depends on the epoch (e.g. its file order), so a pipeline
        builds it once per epoch. False: build it once, iterate it again each epoch (it caches,
        reads in a fixed order, or draws its own per-iteration order)."""
        return False

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        raise NotImplementedError

    def build_from(self, context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
        """A seekable source's stream after its first `start` elements (see `seekable`)."""
        raise NotImplementedError(f"{type(self).__name__} is not seekable")

    @property
    def names(self) -> tuple[str, ...]:
        """The named sources this one mixes, in data.mixture.sources order (each example's `_source` indexes
        them); () for a single source."""
        return ()

    def resume_state(self) -> Optional[str]:
        """What a checkpoint must keep of this source beside the input position (a mixture: its weights and
        since when, a few numbers as text); None for a source the position alone places."""
        return None

    def as_saved(self, state: str) -> "Source":
        """The source as it was when `state` (its `resume_state()`) was saved."""
        return self

    def with_resume_state(self, state: str, example: int, margin: int,
                          when: Optional[Callable[[int], str]] = None) -> tuple["Source", Optional[str]]:
        """This source continuing a saved one (`resume_state()` then) whose stream is at `example`; what may
        still come from before within `margin` examples; and a line to log when something changed
        (`when(example)`: how it says from where the change takes effect)."""
        return self, None


class RecordFileSource(Source):
    """Base of the sources that read serialized records from TFRecord files with `read` (a dataclass field)."""

    yields_records: ClassVar[bool] = True
    read: ReadOptions

    def with_read(self, read: ReadOptions) -> "RecordFileSource":
        return dataclasses.replace(self, read=read)  # type: ignore[type-var]

    def files_source(self) -> Any:
        """The TFRecordSource of the files read (itself, or a dataset directory's shards)."""
        raise NotImplementedError

    def record_sources(self) -> tuple["RecordFileSource", ...]:
        """The sources whose records this one reads as they are stored: itself (a mixture: each of its own)."""
        return (self,)

    @property
    def per_epoch(self) -> bool:
        # A record cache replays epoch 0's order (built once); unshuffled files are the same every epoch.
        return self.read.shuffle_files and not self.read.cache_records
