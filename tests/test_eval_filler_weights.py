"""Exact evaluation when the data brings its own per-token weights (a language model's segment ids or
masks): the padded last batch and the filler steps weigh nothing, and every real token counts once.

`PadToSteps` builds the weights itself when the data has none (tests/test_exact_eval.py); with the
data's own, it pads them. Here the weighted targets of a whole evaluation pass, on two input
pipelines of four replicas, are compared with the converted documents themselves.
"""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records import read_metadata

from test_text_lm import converted, lm_config

pytestmark = pytest.mark.tf_builds

PIPELINES, REPLICAS = 2, 4


def _documents(data_dir: str, split: str) -> list[list[int]]:
    metadata = read_metadata(data_dir)
    return [list(tf.train.Example.FromString(raw.numpy()).features.feature["tokens"].int64_list.value)
            for name in metadata["splits"][split]["files"]
            for raw in tf.data.TFRecordDataset(os.path.join(data_dir, name), compression_type=metadata["compression"])]


def _evaluation_section(data_dir: str, mode: str, length: int) -> dict:
    section = lm_config(data_dir, "unused", length=length)["eval_data"]
    section["batch_size"] = 8  # 2 rows a replica
    if mode == "pad":
        section["sequence"] = {"keys": ["inputs", "targets"], "length": length, "mode": "pad"}
        section["outputs"] = {"inputs": ["inputs", "inputs_mask"], "targets": "targets", "weights": "targets_mask"}
    return section


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_filler_weighs_nothing_and_every_real_token_counts_once(tmp_path, mode):
    length = 160  # every document (at most ~150 tokens) fits one row whole
    data_dir = converted(tmp_path, count=300)
    pipeline = Pipeline.from_config(config_from_dict({"data": _evaluation_section(data_dir, mode, length)}).data)
    pipeline = pipeline.for_evaluation()
    steps = pipeline.evaluation_steps(REPLICAS, PIPELINES)

    weighted, rows, filler_rows = collections.Counter(), 0, 0
    total_weight = 0.0
    for index in range(PIPELINES):
        elements = list(pipeline.build(tf.distribute.InputContext(PIPELINES, index, REPLICAS)).as_numpy_iterator())
        assert len(elements) == steps * REPLICAS // PIPELINES  # every input pipeline makes the same steps
        for inputs, targets, weights in elements:
            assert weights.shape == targets.shape == (2, length)
            marker = inputs["inputs_segment_ids"] if mode == "pack" else inputs["inputs_mask"]
            assert set(np.unique(weights)) <= {0.0, 1.0}
            np.testing.assert_array_equal(weights, (marker > 0).astype(np.float32),
                                          err_msg="weight 1 exactly on the real tokens, 0 on padding and filler")
            total_weight += float(weights.sum())
            rows += len(weights)
            filler_rows += int((weights.sum(axis=1) == 0).sum())
            for row, row_weights, row_marker in zip(targets, weights, marker):
                # each document's next-token targets, as one run of weighted positions per segment
                for segment in sorted(set(row_marker[row_weights > 0].tolist())):
                    weighted[tuple(row[(row_marker == segment) & (row_weights > 0)].tolist())] += 1

    documents = _documents(data_dir, "validation")
    expected = collections.Counter(tuple(ids[1:]) for ids in documents)
    assert filler_rows > 0, "the pass must end in padding rows or filler steps for this test to test them"
    assert total_weight == sum(len(ids) - 1 for ids in documents)
    assert weighted == expected, "every document's targets once, nothing else weighted"
