"""The three baseline input pipelines the issue names, built exactly as specified.

  seed          list_files → interleave(TFRecordDataset + per-element parse/preprocess map,
                cycle_length=4, block_length=16) → batch → prefetch(AUTOTUNE)
  all-AUTOTUNE  interleave(TFRecordDataset, cycle_length=AUTOTUNE, num_parallel_calls=AUTOTUNE,
                deterministic=False) → per-element map(num_parallel_calls=AUTOTUNE,
                deterministic=False) → batch → prefetch(AUTOTUNE)
  InputReader   tensorflow/models official.core.input_reader.InputReader with a per-element
                decoder (parse_single_example) and parser (the preprocessing)

Each takes a `Workload` (benchmarks/workloads.py): its per-example decoder and preprocessing.
"""
from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def _seed() -> tf.Tensor:
    """A per-element random seed for the stateless ops (baselines map single records)."""
    return tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int64)


def seed_pipeline(pattern: str, workload: Any) -> tf.data.Dataset:
    files = tf.data.Dataset.list_files(pattern).repeat()
    dataset = files.interleave(
        lambda path: tf.data.TFRecordDataset(path).map(lambda record: workload.work(record, _seed())),
        cycle_length=4, block_length=16,
    )
    return dataset.batch(workload.batch_size, drop_remainder=True).prefetch(AUTOTUNE)


def all_autotune_pipeline(pattern: str, workload: Any) -> tf.data.Dataset:
    files = tf.data.Dataset.list_files(pattern).repeat()
    dataset = files.interleave(
        tf.data.TFRecordDataset, cycle_length=AUTOTUNE, num_parallel_calls=AUTOTUNE, deterministic=False
    )
    dataset = dataset.map(lambda record: workload.work(record, _seed()), num_parallel_calls=AUTOTUNE, deterministic=False)
    return dataset.batch(workload.batch_size, drop_remainder=True).prefetch(AUTOTUNE)


def input_reader_pipeline(pattern: str, workload: Any, shuffle_buffer: int = 10_000) -> tf.data.Dataset:
    """tensorflow/models' InputReader (pip install --no-deps tf-models-official gin-config)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from official.core import config_definitions, input_reader

    params = config_definitions.DataConfig(
        input_path=pattern, global_batch_size=workload.batch_size, is_training=True, drop_remainder=True,
        shuffle_buffer_size=shuffle_buffer, deterministic=False, cycle_length=None,
    )
    reader = input_reader.InputReader(
        params, dataset_fn=tf.data.TFRecordDataset,
        decoder_fn=workload.decode,
        parser_fn=lambda features: workload.preprocess(features, _seed()),
    )
    return reader.read()


BASELINES = {"seed": seed_pipeline, "all-AUTOTUNE": all_autotune_pipeline, "InputReader": input_reader_pipeline}
