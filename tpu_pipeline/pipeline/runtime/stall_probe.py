"""Where a pipeline that yields nothing is stuck: its stages probed one prefix at a time, on the error path.

A stream can stop yielding with data in its files: every example empty after an op (a one-token
document has no tokens after `lm_shift`, so packing makes no row, epoch after epoch), an input
pipeline whose share of the files holds nothing, a remote read that never answers, a tf.data service
with no workers. tf.data says nothing of which stage waits. So, only once a stream has delivered
nothing for long (`train.stall`), the pipeline is rebuilt from its source alone, then with one more
stage at a time, each asked for its first element within a few seconds on a thread of its own: the
first prefix that ends with nothing, or gives nothing in time, names the stage (and the config key)
where the stream is stuck. The fast path pays nothing.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.pipeline.checks.record_check import tf_message
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource

_ELEMENT, _EMPTY, _SLOW, _FAILED = "element", "empty", "slow", "failed"


def where_stuck(pipeline: Any, context: Optional[tf.distribute.InputContext] = None, seconds: float = 10.0) -> str:
    """A clause saying where `pipeline`'s stream (input pipeline `context`) is stuck, and what to check: the
    tf.data service it reads through, its source, or the first stage that yields nothing (each prefix of
    the stages gets up to `seconds` for its first element)."""
    prefix = pipeline.prefix
    split = pipeline.service
    if split is not None:
        job = f", job {split.job_name}" if split.job_name else ""
        return (f"at the tf.data service {split.address} ({split.mode}{job}): its workers made no batch; check "
                f"that `tpu-pipeline serve worker` processes run and reach that dispatcher")
    context = context or tf.distribute.InputContext()
    stages = tuple(pipeline.stages)
    source = describe_source(pipeline.source, prefix)
    for count in range(len(stages) + 1):
        probe = dataclasses.replace(pipeline, stages=stages[:count])
        outcome, detail = _first_element(lambda: probe._stream(probe.parts, context), seconds)
        if outcome == _ELEMENT:
            continue
        pipe = f" for input pipeline {context.input_pipeline_id} of {context.num_input_pipelines}" \
            if context.num_input_pipelines > 1 else ""
        if count == 0:
            if outcome == _EMPTY:
                return (f"at the source, {source}: it yields no record{pipe} (its share of the files holds none); "
                        f"check the files with `tpu-pipeline verify`")
            if outcome == _FAILED:
                return f"at the source, {source}: reading it fails ({detail})"
            return (f"at the source, {source}: no record read in {seconds:g} s{pipe} (a file system that does not "
                    "answer? check that the files can be read from this machine)")
        stage = stages[count - 1]
        name = stage_name(stage, prefix)
        hint = _hint(stage, prefix)
        if outcome == _EMPTY:
            return (f"at {name}: its input yields elements, it yields none{pipe}" + (f" ({hint})" if hint else ""))
        if outcome == _FAILED:
            return f"at {name}: it fails ({detail})"
        return (f"at {name}: its input yields elements, it yields none in {seconds:g} s{pipe}"
                + (f" ({hint})" if hint else ""))
    return ("somewhere after its first elements: each stage, built alone again, yields an element; a remote read "
            "that stopped answering, or a stage that waits for more input than comes")


def describe_source(source: Any, prefix: str = "data") -> str:
    """The config key and value a source comes from, for a message."""
    names = getattr(source, "names", ())
    if names:
        return f"{prefix}.mixture ({', '.join(names)})"
    if isinstance(source, DatasetDirSource):
        return f"{prefix}.source.dir={source.dir} (split {source.split})"
    if isinstance(source, TFRecordSource):
        files = source.files if isinstance(source.files, str) else ", ".join(source.files)
        return f"{prefix}.source.files={files}"
    return type(source).__name__


def stage_name(stage: Any, prefix: str = "data") -> str:
    """A stage by what a config calls it (the key that puts it there), else by its class."""
    kind = type(stage).__name__
    roles = getattr(stage, "roles", ())
    if "windowed" in roles:
        return f"{prefix}.sequence (mode {getattr(stage, 'mode_name', '') or kind})"
    if kind == "PadTo":
        return f"{prefix}.sequence (mode pad)"
    if kind == "Batch":
        if getattr(stage, "records", False) and not getattr(stage, "per_replica", True):
            return f"the windows of records {prefix}.sequence cuts ({stage.global_batch_size} records each)"
        return f"the batch ({prefix}.batch_size={stage.global_batch_size})"
    if kind == "MapFeatures":
        return f"the parse and ops ({getattr(stage, 'name', '')}: {prefix}.features, {prefix}.preprocess, {prefix}.augment)"
    if kind in ("Shuffle", "WindowShuffle"):
        return f"the shuffle ({prefix}.shuffle)"
    if kind == "Cache":
        return f"the cache ({prefix}.cache)"
    if kind == "Repeat":
        return f"the repeat ({prefix}.repeat)"
    return f"the stage {kind}"


def _hint(stage: Any, prefix: str) -> str:
    if getattr(stage, "mode_name", None) is not None or "windowed" in getattr(stage, "roles", ()):  # bucket or pack
        return ("every example may hold no token once the ops ran, e.g. documents of one token after lm_shift, "
                "which leaves a document one token shorter: a language model needs two or more per document")
    return ""


def _first_element(build: Callable[[], tf.data.Dataset], seconds: float) -> tuple[str, str]:
    """(outcome, detail) of asking a freshly built dataset for its first element on a daemon thread, waiting at
    most `seconds`: an element, empty (it ended), slow (nothing in time: the thread is left behind), failed."""
    results: queue.Queue = queue.Queue()

    def first() -> None:
        try:
            with tf.init_scope():
                for _ in build().take(1):
                    results.put((_ELEMENT, ""))
                    return
            results.put((_EMPTY, ""))
        except Exception as error:  # the diagnosis reports it; it must not raise itself
            results.put((_FAILED, f"{type(error).__name__}: {tf_message(error)}"))

    threading.Thread(target=first, name="tpu_pipeline-stall-probe", daemon=True).start()
    try:
        return results.get(timeout=seconds)
    except queue.Empty:
        return _SLOW, ""
