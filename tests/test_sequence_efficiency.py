"""How much of a sequence batch is tokens (pipeline.efficiency), shown by bench, demo and doctor, and
a TPU check that knows bucketed shapes and advises the TPU's tiling (multiples of 128 and 8)."""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.bench.doctor import sequence_report
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import TpuCompatibilityError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.checks.tpu_check import check_tpu_compatible, tpu_advice, tpu_problems
from tpu_pipeline.pipeline.sequences.fill_estimates import bucket_fraction, pack_fraction, pad_fraction
from tpu_pipeline.pipeline.sequences.sequence_stages import bucket_batches
from tpu_pipeline.pipeline.sequences.token_count import (
    example_lengths, non_padding_fraction, real_and_slots, real_examples, sequence_keys,
)
from tpu_pipeline.records.writer import int_feature, write_split

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTH = 64
NUM_EXAMPLES = 240


def ints(rows) -> tf.Tensor:
    return tf.constant(rows, tf.int32)


# Hand-made batches of each mode. Token values are 0 on purpose: only the markers tell padding.
PAD = {"tokens": ints([[0, 0, 0, 0], [0, 0, 0, 0]]), "tokens_mask": ints([[1, 1, 0, 0], [1, 0, 0, 0]])}
BUCKET = {"tokens": ints([[0] * 4] * 3), "tokens_mask": ints([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]),
          "example_mask": ints([1, 1, 0]), "id": ints([7, 8, 0])}
PACK = {"tokens": ints([[0] * 6] * 2), "tokens_segment_ids": ints([[1, 1, 2, 2, 2, 0], [1, 0, 0, 0, 0, 0]]),
        "tokens_positions": ints([[0, 1, 0, 1, 2, 0], [0, 0, 0, 0, 0, 0]])}


@pytest.mark.parametrize("batch, real, slots, examples, lengths", [
    (PAD, 3, 8, 2, [2, 1]),
    (BUCKET, 5, 12, 2, [3, 2]),  # the padding example is neither an example nor tokens, but it is slots
    (PACK, 6, 12, 3, [2, 3, 1]),
], ids=["pad", "bucket", "pack"])
def test_real_tokens_slots_and_fraction_of_each_mode(batch, real, slots, examples, lengths):
    counted = real_and_slots(batch)
    assert [int(v) for v in counted] == [real, slots] and counted[0].dtype == tf.int64
    fraction = non_padding_fraction(batch)
    assert fraction.dtype == tf.float32 and float(fraction) == pytest.approx(real / slots)
    assert int(real_examples(batch)) == examples
    assert sorted(example_lengths(batch).numpy().tolist()) == sorted(lengths)
    # The same in a tf.function and in a dataset.map (what train and bench use).
    assert [int(v) for v in tf.function(real_and_slots)(batch)] == [real, slots]
    mapped = tf.data.Dataset.from_tensors(batch).map(non_padding_fraction).get_single_element()
    assert float(mapped) == pytest.approx(real / slots)


def test_after_data_outputs_the_first_key_counts_and_keys_can_be_named():
    inputs = {"tokens": PACK["tokens"], "tokens_segment_ids": PACK["tokens_segment_ids"]}
    targets = {"targets": ints([[5, 0, 0, 0]]), "targets_mask": ints([[1, 1, 1, 0]])}
    batch = (inputs, targets)
    assert [k.name for k in sequence_keys(batch)] == ["tokens", "targets"]
    assert [int(v) for v in real_and_slots(batch)] == [6, 12]  # inputs first: one key, not both
    assert [int(v) for v in real_and_slots(batch, keys="targets")] == [3, 4]
    assert [int(v) for v in real_and_slots(batch, keys=["tokens", "targets"])] == [9, 16]
    spec = tf.data.Dataset.from_tensors(batch).element_spec  # the names alone are enough
    assert [(k.name, k.packed) for k in sequence_keys(spec)] == [("tokens", True), ("targets", False)]
    with pytest.raises(ValueError, match=r"no token key in this batch \(features: \['image', 'label'\]\)"):
        real_and_slots({"image": tf.zeros([2, 4]), "label": ints([0, 1])})
    with pytest.raises(ValueError, match=r"keys \['nope'\] have no <key>_segment_ids or <key>_mask"):
        real_and_slots(batch, keys="nope")
    assert float(non_padding_fraction({"tokens_mask": tf.zeros([0, 4], tf.int32)})) == 0.0  # no slots


# Real TFRecord files: skewed lengths (most examples short, a few long), token 0 among the ids.

def skewed_lengths() -> list[int]:
    rng = np.random.default_rng(5)
    return [int(n) for n in np.clip(rng.lognormal(2.3, 0.8, NUM_EXAMPLES), 1, LENGTH)]


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)

    def examples():
        for index, n in enumerate(skewed_lengths()):
            ids = tf.train.Int64List(value=rng.integers(0, 10, n).tolist())
            feature = {"tokens": tf.train.Feature(int64_list=ids), "id": int_feature(index)}
            yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split(examples(), str(directory), "train", 3)
    return os.path.join(str(directory), "train-*")


def sequence_config(files: str, mode: str, **sequence) -> dict:
    features = {"tokens": {"dtype": "int64", "kind": "ragged", "cast": "int32"}}
    ops = []
    if mode != "pack":  # pack refuses other features
        features["id"] = {"dtype": "int64"}
        ops = [{"op": "cast", "key": "id", "dtype": "int32"}]
    return {"source": {"type": "tfrecord", "files": files}, "features": features, "preprocess": ops, "batch_size": 8,
            "repeat": 1,
            "shuffle": {"enabled": False}, "sequence": {"keys": ["tokens"], "length": LENGTH, "mode": mode, **sequence},
            **({"drop_remainder": False} if mode == "pack" else {})}


def pipeline_of(raw: dict, **kwargs) -> Pipeline:
    return Pipeline.from_config(config_from_dict({"data": raw}).data, **kwargs)


def counted(dataset: tf.data.Dataset) -> tuple[int, int, list[int]]:
    real = slots = 0
    lengths: list[int] = []
    for batch in dataset:
        more_real, more_slots = real_and_slots(batch)
        real, slots = real + int(more_real), slots + int(more_slots)
        lengths += example_lengths(batch).numpy().tolist()
    return real, slots, lengths


def test_pack_fills_more_of_each_batch_than_pad_on_real_files_and_the_estimates_match(token_files):
    lengths = skewed_lengths()
    pad_real, pad_slots, stream = counted(pipeline_of(sequence_config(token_files, "pad")).build())
    assert sorted(stream) == sorted(lengths) and pad_real == sum(lengths)  # 240 = 30 batches: nothing dropped
    assert pad_slots == NUM_EXAMPLES * LENGTH and pad_real / pad_slots == pad_fraction(stream, LENGTH)
    pack_real, pack_slots, _ = counted(pipeline_of(sequence_config(token_files, "pack", window=64)).build())
    assert pack_real == sum(lengths)
    assert pack_real / pack_slots > pad_real / pad_slots + 0.3, (pack_real / pack_slots, pad_real / pad_slots)
    # The doctor's estimates, on the lengths in stream order, are what the pipelines do.
    assert pack_real / pack_slots == pytest.approx(pack_fraction(stream, LENGTH, 64), abs=0.0)
    bucket_real, bucket_slots, _ = counted(pipeline_of(sequence_config(token_files, "bucket", window=64)).build())
    bounds = [8, 16, 32, 64]
    sizes = bucket_batches(bounds, 8, tf.distribute.InputContext())
    assert bucket_real == sum(lengths)
    assert bucket_real / bucket_slots == pytest.approx(bucket_fraction(stream, bounds, sizes, 64), abs=0.0)


def test_the_doctor_names_the_mode_and_window_that_raise_the_fraction(token_files):
    raw = sequence_config(token_files, "pad")
    config = config_from_dict({"data": raw}).data
    report = sequence_report(config, pipeline_of(raw).plan)
    assert report.examples == NUM_EXAMPLES and report.fraction == pytest.approx(sum(skewed_lengths()) / (NUM_EXAMPLES * LENGTH))
    assert report.fraction < 0.7
    (pack,) = [f for f in report.findings if f.overrides == ("data.sequence.mode=pack",)]
    estimate = pack_fraction(sorted(skewed_lengths()), LENGTH, 1024)  # one window: order does not matter
    assert f"mode: pack would put ~{estimate:.0%} tokens in each row" in pack.problem, pack.problem
    assert "pack mode refuses the other features (id)" in pack.problem
    text = "\n".join(report.lines())
    assert f"sequence: pad to {LENGTH}; key 'tokens', {NUM_EXAMPLES} examples seen" in text, text
    assert "fix (advice, not in the tuned config): data.sequence.mode=pack" in text

    assert "placement:" not in text  # pad mode places nothing

    raw = sequence_config(token_files, "pack", window=8)
    report = sequence_report(config_from_dict({"data": raw}).data, pipeline_of(raw).plan)
    assert [f.overrides for f in report.findings] == [("data.sequence.window=1024",)]
    assert f"window: 8 packs {report.fraction:.1%}" in report.findings[0].problem
    # Which placement this TensorFlow runs, asked of the build itself (no XLA for the CPU in the TPU build).
    try:
        tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(0))
        expected = f"placement: rows placed by a loop XLA compiles (TensorFlow {tf.__version__})"
    except tf.errors.OpError:
        expected = f"placement: rows placed on TensorFlow's executor: TensorFlow {tf.__version__} has no XLA"
    assert expected in "\n".join(report.lines()), report.lines()


def test_doctor_runs_on_a_sequence_config_and_prints_the_fraction(token_files):
    from tpu_pipeline.bench.doctor import diagnose

    config = config_from_dict({"data": sequence_config(token_files, "pad")}).data
    diagnosis = diagnose(config, batches=3, repeats=1, records=64, measure_tuned=False)
    table = diagnosis.table()
    assert "sequence (pad to 64)" in table  # a stage of its own (it failed on opaque records before)
    measured = diagnosis.pipeline.non_padding_fraction
    assert 0 < measured < 0.7 and f"non-padding fraction: {measured:.3f} over the timed batches" in table, table
    assert diagnosis.as_dict()["sequence"]["findings"][0]["overrides"] == ["data.sequence.mode=pack"]


# The CLI, as a user runs it.

def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_demo_and_bench_print_tokens_per_second_and_the_fraction(token_files, tmp_path):
    pad, pack = tmp_path / "pad.yaml", tmp_path / "pack.yaml"
    yaml.safe_dump({"data": {**sequence_config(token_files, "pad"), "repeat": "forever"}}, open(pad, "w"))
    yaml.safe_dump({"data": {**sequence_config(token_files, "pack", window=64), "repeat": "forever",
                             "drop_remainder": True}}, open(pack, "w"))

    demo = cli("demo", "--config", str(pad), "--steps", "5", "--warmup", "1", "--explain")
    assert demo.returncode == 0, demo.stderr[-3000:]
    line = re.search(r"^tokens: ([\d,]+) tokens/s, non-padding fraction (0\.\d+) \(([\d,]+) real tokens of ([\d,]+) "
                     r"slots of 'tokens', data.sequence.mode=pad\)$", demo.stdout, re.M)
    assert line, demo.stdout
    real, slots = (int(line.group(i).replace(",", "")) for i in (3, 4))
    assert slots == 5 * 8 * LENGTH and float(line.group(2)) == pytest.approx(real / slots, abs=1e-3)
    plan = [row for row in demo.stdout.splitlines() if re.match(r"  [a-z_]+ +\S", row)]
    reason_column = {row.index("data.sequence.mode=pad") for row in plan if row.startswith("  sequence")}
    assert reason_column == {plan[0].index("auto:")}, plan  # the reasons form one column, the sequence row too

    out = tmp_path / "bench.json"
    bench = cli("bench", "--config", str(pack), "--steps", "4", "--repeats", "1", "--warmup", "1", "--noceilings",
                "--json", str(out))
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert re.search(r"^  tokens/s +[\d,]+   \(real tokens of tokens; padding not counted\)$", bench.stdout, re.M), bench.stdout
    fraction = re.search(r"^  non-padding +([\d.]+)%   \(([\d,]+) real of ([\d,]+) slots of 'tokens'; "
                         r"data.sequence.mode=pack\)$", bench.stdout, re.M)
    assert fraction and float(fraction.group(1)) > 90, bench.stdout
    median = json.load(open(out))["median"]
    assert median["token_slots"] == 4 * 8 * LENGTH and median["non_padding_fraction"] > 0.9
    assert json.load(open(out))["token_key"] == "tokens"


# The TPU check: bucketed shapes allowed, tiling advised, ragged refused.

def test_tpu_advice_names_the_keys_and_the_nearest_multiples_of_128_and_8():
    spec = {"tokens": tf.TensorSpec([12, 200], tf.int32), "tokens_mask": tf.TensorSpec([12, 200], tf.int32)}
    batch, length = tpu_advice(spec, replicas=2)
    assert batch.startswith("data.batch_size=24 gives batches of 12 per replica (2 replicas); a TPU tiles the batch "
                            "dimension by 8") and batch.endswith("use data.batch_size=16 or data.batch_size=32"), batch
    assert length.startswith("data.sequence.length=200: a TPU tiles the last dimension by 128, so a row of 200 tokens "
                             "computes on 256 (22% padding)") and length.endswith("use 128 or 256"), length
    good = {"tokens": tf.TensorSpec([8, 256], tf.int32), "tokens_segment_ids": tf.TensorSpec([8, 256], tf.int32)}
    assert tpu_advice(good) == []
    (per_key,) = tpu_advice({}, sequence_lengths={"inputs": 512, "targets": 100}, prefix="eval_data")
    assert per_key.startswith("eval_data.sequence.length.targets=100:") and per_key.endswith("use 128"), per_key
    (buckets,) = tpu_advice({}, sequence_lengths={"tokens": 512}, bucket_lengths=[64, 128, 512])
    assert buckets.startswith("data.sequence.boundaries: buckets of 64 tokens are not multiples of 128"), buckets


def test_bucket_mode_passes_the_tpu_check_with_advice_and_ragged_without_sequence_is_refused(token_files, caplog):
    raw = {**sequence_config(token_files, "bucket", window=64), "batch_size": 12}
    pipeline = pipeline_of(raw, target="tpu")
    with caplog.at_level(logging.WARNING):
        dataset = pipeline.build(tf.distribute.InputContext(1, 0, 2))  # 6 per replica
    assert dataset.element_spec["tokens"].shape.as_list() == [6, None]  # one shape per bucket, allowed
    advice = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TPU advice: ")]
    assert any("data.batch_size=12 gives batches of 6 per replica (2 replicas)" in a and "use data.batch_size=16" in a
               for a in advice), advice
    assert any("data.sequence.length=64:" in a and "use 128" in a for a in advice), advice
    # Told nothing, the same spec is refused: the allowance comes from the plan, not from the spec.
    assert any("dynamic shape" in p for p in tpu_problems(dataset.element_spec))
    assert check_tpu_compatible(dataset, allow_dynamic=("tokens",), sequence_lengths={"tokens": 128}, replicas=2) == [
        a[len("TPU advice: "):] for a in advice if "batch_size" in a]
    # A dynamic dimension of another feature stays refused in a bucketed pipeline.
    assert tpu_problems({"image": tf.TensorSpec([8, None], tf.float32)}, allow_dynamic=("tokens",))

    ragged = {key: value for key, value in sequence_config(token_files, "pad").items() if key != "sequence"}
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_of(ragged, target="tpu").build()
    problems = str(error.value).splitlines()[1:]
    assert len(problems) == 1 and "feature 'tokens' is RaggedTensorSpec" in problems[0], problems
    assert "data.sequence: {keys: [tokens], length: N, mode: pad|bucket|pack}" in problems[0]


def test_a_progress_line_whose_steps_read_no_new_batch_says_so_rather_than_zero_tokens():
    """Keras 3 on JAX reads batches ahead of its steps, so the steps of a first progress line could take only
    batches read before them: the line said "0 tokens/s, non-padding 0.000", a figure of nothing measured."""
    import types

    from tpu_pipeline.train.callbacks import ProgressLogger

    meter = types.SimpleNamespace(real=tf.Variable(0, dtype=tf.int64), slots=tf.Variable(0, dtype=tf.int64))
    lines = []
    logger = ProgressLogger(global_batch_size=16, every=2, tokens=meter, printer=lines.append)
    logger.model = types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=tf.Variable(0, dtype=tf.int64)))
    logger.on_train_begin()
    for step, (real, slots) in enumerate([(3000, 4096), (3000, 4096), (3000, 4096), (5000, 8192), (8000, 12288)], 1):
        logger.on_train_batch_begin(step)
        meter.real.assign(real), meter.slots.assign(slots)  # read ahead: steps 2 and 3 read nothing new
        logger.model.optimizer.iterations.assign(step)
        logger.on_train_batch_end(step)
    assert "tokens/s not counted yet: these steps' batches were read ahead" in lines[0] and "0.000" not in lines[0]
    assert "tokens/s, non-padding 0.488" in lines[1]  # steps 3-4: (5000 - 3000) / (8192 - 4096)

    # A run of two steps whose second took a batch read before it: metrics.json's tokens_per_sec is None, not 0.
    short = ProgressLogger(global_batch_size=16, every=100, tokens=meter, printer=lines.append)
    short.model = logger.model
    short.on_train_begin()
    for step in (6, 7):
        short.on_train_batch_begin(step)
        logger.model.optimizer.iterations.assign(step)
        short.on_train_batch_end(step)
    assert short.tokens_per_second() is None and logger.tokens_per_second() > 0
