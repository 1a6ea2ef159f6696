"""A mixture of two image sources trained by two real TF_CONFIG workers on loopback, resumed on one host and on two
again (issue 51): the rest of each source's epoch dealt to the new hosts, then each host's own mixture, each
source from its next epoch. The labels are the images' ids, unique across the sources, so the ids each step
trained on say which record of which source it was.

Slow (two TensorFlow processes per round): `pytest -m "not slow"` skips it locally; CI runs it.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from test_multiworker import start_workers, two_then_one_then_two
from test_multiworker_sequences import assert_every_document_once_an_epoch
from test_preemption import train_config
from tpu_pipeline.records.writer import write_split

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

SOURCES = {"photos": (0, 512, 0.6), "sketches": (600, 256, 0.4)}  # name: (first id, images, weight)
EPOCHS, STEPS_PER_EPOCH, CLASSES = 3, 8, 856  # global batch 64: ~1.8 passes over photos, ~2.4 over sketches


def image_sources(root: str) -> list[dict]:
    """Each source's TFRecord files of 16x16 JPEGs, ids from its first: the mixture's `sources` entries."""
    rng = np.random.default_rng(5)
    entries = []
    for name, (first, count, weight) in SOURCES.items():
        def examples(first: int = first, count: int = count):
            for index in range(count):
                pixels = tf.constant(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
                jpeg = tf.io.encode_jpeg(pixels).numpy()
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                           "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[first + index]))}
                yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

        write_split(examples(), os.path.join(root, name), "train", 4)
        entries.append({"name": name, "weight": weight,
                        "source": {"type": "tfrecord", "files": os.path.join(root, name, "train-*.tfrecord")}})
    return entries


def mixture_run(tmp_path) -> tuple[dict, str, str]:
    """(the config, run_dir, out_dir) of a mixture of the two sources, the ids as labels, a checkpoint every 2 steps."""
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    raw = train_config(str(tmp_path / "unused"), run_dir)
    del raw["data"]["source"]
    raw["data"]["mixture"] = {"sources": image_sources(str(tmp_path / "images"))}
    raw["data"]["repeat"] = "forever"
    raw["train"].update(epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, num_classes=CLASSES, checkpoint_every_steps=2)
    return raw, run_dir, out_dir


def assert_every_image_once_an_epoch(out_dir: str) -> None:
    """Each source's images m or m + 1 times over the run, every one at least once (`assert_every_document...`)."""
    for first, count, _ in SOURCES.values():
        assert_every_document_once_an_epoch(out_dir, EPOCHS * STEPS_PER_EPOCH, count, first)


def test_a_mixture_goes_on_exactly_on_one_host_then_on_two_again(tmp_path):
    """Two workers get SIGTERM; one host of 2 replicas resumes, the rest of each source's epoch the two had left
    dealt to it, and is SIGKILLed inside it after a checkpoint; two workers resume from that and finish."""
    raw, run_dir, out_dir = mixture_run(tmp_path)

    def killed(resumed_at: int, said: str) -> None:
        assert ("this run has 1 host (2 replicas), the checkpoint 2 hosts: the rest of the sources' data epochs"
                in said and "is dealt to this host, then each mixes its own shards" in said), said[-3000:]
        reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{resumed_at}"))
        layout = json.loads(reader.get_tensor("input_layout/saved/.ATTRIBUTES/VARIABLE_VALUE").decode())
        assert layout["remainder"]["lefts"], layout  # killed inside the dealt rest

    printed = two_then_one_then_two(raw, tmp_path, start_workers, "train", killed)
    assert ("this run has 2 hosts (2 replicas), the checkpoint 1 host: the rest of the sources' data epochs"
            in printed[0]), printed[0][-3000:]
    assert json.load(open(os.path.join(run_dir, "metrics.json")))["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert_every_image_once_an_epoch(out_dir)
