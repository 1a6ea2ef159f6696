"""Variable-length token features (`kind: ragged`, SequenceExample `kind: sequence`) and the sequence ops,
on real TFRecord files read through `Pipeline.from_config`.

Token id 0 is a real token everywhere here: every data set holds some, and none may be lost or taken
for padding. Batching sequences of different lengths is the next stage's job (`data.sequence`), so
pipelines here batch one example (or parse whole batches, which keeps the rows ragged).

The ops take one example's 1-D tensor or a ragged batch `[B, None]` (a whole batch parsed at once), and
each row of the batch must come out as that example would alone: checked on random rows (lengths and
ids 0 included) and on real TFRecord bytes through the batched parser.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.data import OpConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import build_ops, get_op
from tpu_pipeline.pipeline import Pipeline, make_parser, tpu_problems

pytestmark = pytest.mark.tf_builds

ROWS = [[0, 5, 0, 7], [], [9], [0], [1, 2, 3, 4, 5, 6], [0, 0, 0]]  # ids 0 kept, an empty and a length-1 row
TEXTS = ["héllo wörld", "", "日本語 ✓ 🙂", "a"]


def int64s(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def write_records(path: str, records) -> str:
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    return path


def token_examples(rows=ROWS, floats_at=None):
    """tf.Examples with `tokens` (int64 ids; float values at record `floats_at`) and `id`."""
    for index, row in enumerate(rows):
        tokens = (tf.train.Feature(float_list=tf.train.FloatList(value=[float(t) for t in row]))
                  if index == floats_at else int64s(row))
        yield tf.train.Example(features=tf.train.Features(feature={"tokens": tokens, "id": int64s([index])}))


def sequence_examples(rows=ROWS, without_list_at=None):
    """tf.SequenceExamples: context `id`, feature list `tokens` of one id per step."""
    for index, row in enumerate(rows):
        example = tf.train.SequenceExample()
        example.context.feature["id"].int64_list.value.append(index)
        if index != without_list_at:
            steps = example.feature_lists.feature_list["tokens"]
            for token in row:
                steps.feature.add().int64_list.value.append(token)
        yield example


@pytest.fixture
def token_file(tmp_path):
    return write_records(str(tmp_path / "tokens.tfrecord"), token_examples())


@pytest.fixture
def sequence_file(tmp_path):
    return write_records(str(tmp_path / "sequences.tfrecord"), sequence_examples())


def token_config(files: str, **overrides) -> dict:
    config = {
        "source": {"type": "tfrecord", "files": files, "shuffle_files": False},
        "features": {"tokens": {"dtype": "int64", "kind": "ragged"}, "id": {"dtype": "int64"}},
        "shuffle": {"enabled": False}, "repeat": 1, "batch_size": 1, "options": {"deterministic": True},
    }
    config.update(overrides)
    return config


def pipeline_of(config: dict) -> Pipeline:
    return Pipeline.from_config(config_from_dict({"data": config}).data)


def examples(config: dict) -> list[dict]:
    """Every example of a batch_size-1 pipeline, as Python values (the batch dimension removed)."""
    out = []
    for batch in pipeline_of(config).build():
        out.append({key: value.numpy()[0].tolist() if not isinstance(value, tf.RaggedTensor) else value.to_list()[0]
                    for key, value in batch.items()})
    return out


# --- kind: ragged ------------------------------------------------------------------------------------------------

def test_a_ragged_feature_parses_per_example_as_int32_1d_with_every_zero_kept(token_file):
    parse = make_parser(config_from_dict({"data": token_config(token_file)}).data.features)
    parsed = [parse(record) for record in tf.data.TFRecordDataset(token_file)]
    for row, example in zip(ROWS, parsed):
        assert type(example["tokens"]) is not tf.RaggedTensor  # one example: a plain 1-D tensor of its length
        assert example["tokens"].dtype == tf.int32 and example["tokens"].shape == [len(row)]
        assert example["tokens"].numpy().tolist() == row
    got = examples(token_config(token_file, parse="per_example"))
    assert [e["tokens"] for e in got] == ROWS and [e["id"] for e in got] == list(range(len(ROWS)))


def test_cast_int64_keeps_the_stored_dtype(token_file):
    config = token_config(token_file, parse="per_example")
    config["features"]["tokens"]["cast"] = "int64"
    spec = pipeline_of(config).build().element_spec["tokens"]
    assert spec == tf.RaggedTensorSpec([1, None], tf.int64, 1, tf.int64)  # no data.sequence: batches stay ragged
    assert [e["tokens"] for e in examples(config)] == ROWS


def test_a_whole_batch_parsed_at_once_keeps_its_rows_ragged(token_file):
    """Without per-example ops the plan parses whole batches: a [B, None] RaggedTensor, never padded with 0s."""
    pipeline = pipeline_of(token_config(token_file, batch_size=len(ROWS)))
    assert pipeline.plan.parse.value == "batched"
    (batch,) = list(pipeline.build())
    assert isinstance(batch["tokens"], tf.RaggedTensor) and batch["tokens"].dtype == tf.int32
    assert batch["tokens"].to_list() == ROWS


def test_an_id_outside_int32_is_an_error_never_a_wrapped_value(tmp_path):
    path = write_records(str(tmp_path / "big.tfrecord"), token_examples([[1, 2], [3, 1 << 40]]))
    config = token_config(path, parse="per_example")
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside int32; set cast: int64"):
        list(pipeline_of(config).build())
    from tpu_pipeline.verify import verify_data

    (fault,) = verify_data(config_from_dict({"data": config}).data, progress=False).faults
    assert (fault.file, fault.record, fault.kind) == (path, 1, "wrong_dtype"), fault
    assert "id 1099511627776" in fault.what and "cast: int64" in fault.fix, fault.line()
    config["features"]["tokens"]["cast"] = "int64"
    assert [e["tokens"] for e in examples(config)] == [[1, 2], [3, 1 << 40]]


def test_a_missing_ragged_feature_is_a_fault_unless_its_default_is_empty(tmp_path):
    records = list(token_examples())
    del records[0].features.feature["tokens"]
    path = write_records(str(tmp_path / "missing.tfrecord"), records)
    missing = r"data.features.tokens: record 0 of .* has no feature 'tokens' .*set default: \[\]"
    with pytest.raises(ConfigError, match=missing):
        pipeline_of(token_config(path))
    config = token_config(path, parse="per_example")
    config["features"]["tokens"]["default"] = []
    assert [e["tokens"] for e in examples(config)] == [[]] + ROWS[1:]


# --- kind: sequence (tf.SequenceExample) -------------------------------------------------------------------------

def sequence_config(files: str, **overrides) -> dict:
    return token_config(files, features={"tokens": {"dtype": "int64", "kind": "sequence"}, "id": {"dtype": "int64"}},
                        **overrides)


def test_sequence_examples_parse_their_feature_lists_and_context(sequence_file):
    config = sequence_config(sequence_file, parse="per_example")
    assert pipeline_of(config).build().element_spec["tokens"] == tf.RaggedTensorSpec([1, None], tf.int32, 1, tf.int64)
    got = examples(config)
    assert [e["tokens"] for e in got] == ROWS and [e["id"] for e in got] == list(range(len(ROWS)))


def test_a_batch_of_sequence_examples_parsed_at_once_stays_ragged(sequence_file):
    """parse_sequence_example pads a batch of feature lists with zeros; 0 is a token, so the rows are cut back."""
    pipeline = pipeline_of(sequence_config(sequence_file, batch_size=len(ROWS)))
    assert pipeline.plan.parse.value == "batched"
    (batch,) = list(pipeline.build())
    assert isinstance(batch["tokens"], tf.RaggedTensor) and batch["tokens"].dtype == tf.int32
    assert batch["tokens"].to_list() == ROWS and batch["id"].numpy().tolist() == list(range(len(ROWS)))


def test_sequence_feature_ops_run_per_example(sequence_file):
    config = sequence_config(sequence_file, preprocess=[{"op": "truncate", "max_length": 2}, {"op": "append", "id": 1}])
    assert [e["tokens"] for e in examples(config)] == [row[:2] + [1] for row in ROWS]


def test_the_kind_and_the_records_must_agree(token_file, sequence_file):
    """SequenceExamples and Examples parse as each other without complaint: the spec decides, and a
    feature looked for in the wrong place names the kind to set."""
    with pytest.raises(ConfigError, match=r"data.features.tokens: .*has no feature 'tokens' .*feature list 'tokens': "
                                          r"set kind: sequence"):
        pipeline_of(token_config(sequence_file))
    with pytest.raises(ConfigError, match=r"data.features.tokens: .*has no feature list 'tokens' .*use kind ragged"):
        pipeline_of(sequence_config(token_file))


def test_verify_checks_sequence_examples_record_by_record(tmp_path):
    from tpu_pipeline.verify import verify_data

    rows = [[0, 1], [2], [3, 4, 5], [6]]
    path = write_records(str(tmp_path / "seq.tfrecord"), sequence_examples(rows, without_list_at=2))
    config = sequence_config(path, preprocess=[{"op": "truncate", "max_length": 1}])  # ops run too
    report = verify_data(config_from_dict({"data": config}).data, progress=False)
    assert report.records == 4
    assert [(f.file, f.record, f.kind) for f in report.faults] == [(path, 2, "missing_feature")], report.table()
    config["features"]["tokens"]["default"] = []  # an absent feature list is then an empty sequence
    assert verify_data(config_from_dict({"data": config}).data, progress=False).faults == []


# --- verify on ragged features ------------------------------------------------------------------------------------

def test_verify_names_the_record_whose_tokens_are_floats(tmp_path):
    from tpu_pipeline.verify import verify_data

    good = write_records(str(tmp_path / "a.tfrecord"), token_examples())
    bad = write_records(str(tmp_path / "b.tfrecord"), token_examples(floats_at=4))
    config = token_config(str(tmp_path / "*.tfrecord"), preprocess=[{"op": "lm_shift"}])
    config["features"]["tokens"]["default"] = []  # ROWS holds an empty document on purpose (else a fault of its own)
    report = verify_data(config_from_dict({"data": config}).data, progress=False)
    assert report.records == 2 * len(ROWS)
    (fault,) = report.faults
    assert (fault.file, fault.record, fault.kind) == (bad, 4, "wrong_dtype"), report.table()
    assert "feature 'tokens' stores float32 values where dtype is int64" in fault.line(), fault.line()
    assert good not in report.table()


# --- the ops -----------------------------------------------------------------------------------------------------

def run_ops(ops: list[dict], rows=ROWS, dtype=tf.int32) -> list[dict]:
    """The ops on 1-D tensors of unknown length (as the pipeline's map sees them), one example at a time."""
    fns, _ = build_ops([OpConfig.model_validate(op) for op in ops])
    dataset = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(rows, dtype=dtype))

    def apply(tokens):
        features = {"tokens": tokens}
        for fn in fns:
            features = fn(features, None)
        return features

    return [{k: v.numpy().tolist() for k, v in e.items()} for e in dataset.map(apply)]


@pytest.mark.parametrize("max_length, keep, expected", [
    (3, "head", [[0, 5, 0], [], [9], [0], [1, 2, 3], [0, 0, 0]]),
    (3, "tail", [[5, 0, 7], [], [9], [0], [4, 5, 6], [0, 0, 0]]),
    (1, "tail", [[7], [], [9], [0], [6], [0]]),
    (6, "head", ROWS),  # exactly max_length and shorter: unchanged
])
def test_truncate(max_length, keep, expected):
    got = run_ops([{"op": "truncate", "max_length": max_length, "keep": keep}])
    assert [e["tokens"] for e in got] == expected


def test_lm_shift_pairs_each_token_with_the_next():
    got = run_ops([{"op": "lm_shift"}])
    assert all(set(e) == {"inputs", "targets"} for e in got)  # tokens removed
    assert [(e["inputs"], e["targets"]) for e in got] == [
        ([0, 5, 0], [5, 0, 7]), ([], []), ([], []), ([], []), ([1, 2, 3, 4, 5], [2, 3, 4, 5, 6]), ([0, 0], [0, 0])]
    kept = run_ops([{"op": "lm_shift", "inputs_key": "x", "targets_key": "y", "keep": True}])
    assert [(e["tokens"], e["x"], e["y"]) for e in kept][0] == ([0, 5, 0, 7], [0, 5, 0], [5, 0, 7])


@pytest.mark.parametrize("rows", [[[0, 5, 0, 7]], [[]], [[9]], [[1, 2], [], [3, 4, 5]], [[], [], [8]]])
def test_lm_shift_of_a_ragged_batch_of_one_or_many_documents_is_the_ragged_slice(rows):
    """A batch of one document is cut by slicing its values (no index as long as the document): the
    same pairs as ragged indexing, in graph mode as a batched parse runs it."""
    shift = get_op("lm_shift").factory()
    tokens = tf.ragged.constant(rows, dtype=tf.int64, row_splits_dtype=tf.int64)
    got = tf.function(lambda t: shift({"tokens": t}))(tokens)
    assert got["inputs"].to_list() == tokens[:, :-1].to_list() and got["targets"].to_list() == tokens[:, 1:].to_list()
    assert got["inputs"].shape.rank == 2 and got["inputs"].row_splits.dtype == tf.int64


def test_lm_shift_of_random_ragged_batches_with_weights_is_the_ragged_slice():
    """The cut by partition (each row's last token out of the inputs, its first out of the targets and their
    weights): random batches with empty, one-token and zero rows, each pair and weight the slice's."""
    shift = tf.function(get_op("lm_shift").factory())
    rng = np.random.default_rng(0)
    for _ in range(30):
        lengths = rng.integers(0, 6, rng.integers(0, 7))
        values = rng.integers(0, 9, int(lengths.sum()))
        tokens = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), tf.constant(lengths, tf.int64))
        weights = tf.ragged.map_flat_values(lambda v: v % 2, tokens)
        got = shift({"tokens": tokens, "loss_weights": weights})
        rows = tokens.to_list()
        assert got["inputs"].to_list() == [row[:-1] for row in rows], rows
        carried = got["weighted_targets"].to_list()  # each 2 * target + its weight
        assert [[v // 2 for v in row] for row in carried] == [row[1:] for row in rows], rows
        assert [[v % 2 for v in row] for row in carried] == [[v % 2 for v in row[1:]] for row in rows], rows


def test_append_and_prepend_add_one_id_even_to_an_empty_sequence():
    got = run_ops([{"op": "prepend", "id": 2}, {"op": "append", "id": 1, "out_key": "with_eos"}])
    assert [e["tokens"] for e in got] == [[2] + row for row in ROWS]
    assert [e["with_eos"] for e in got] == [[2] + row + [1] for row in ROWS]
    eos_kept = run_ops([{"op": "truncate", "max_length": 2}, {"op": "append", "id": 0}], dtype=tf.int64)
    assert [e["tokens"] for e in eos_kept] == [row[:2] + [0] for row in ROWS]  # id 0 is a real token


def test_tokenize_bytes_round_trips_utf8_text_through_a_pipeline(tmp_path):
    records = [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")]))})) for text in TEXTS]
    path = write_records(str(tmp_path / "text.tfrecord"), records)
    config = token_config(path, features={"text": {"dtype": "string"}},
                          preprocess=[{"op": "tokenize_bytes", "out_key": "tokens"},
                                      {"op": "keep", "keys": ["tokens"]}])
    got = examples(config)
    assert pipeline_of(config).build().element_spec["tokens"].dtype == tf.int32
    for text, example in zip(TEXTS, got):
        assert bytes(i - 3 for i in example["tokens"]) == text.encode("utf-8")
        assert all(3 <= i < 259 for i in example["tokens"])  # ids 0, 1, 2 stay free for pad, EOS, BOS
    config["preprocess"][0]["offset"] = 0
    assert [bytes(e["tokens"]).decode("utf-8") for e in examples(config)] == TEXTS


# --- the ops on ragged batches: each row as its example alone -------------------------------------------------------

def apply_ops(fns):
    def apply(features):
        for fn in fns:
            features = fn(features, None)
        return features

    return apply


def one_by_one(ops: list[dict], columns: dict) -> list[dict]:
    """The ops on each example alone (1-D tensors, or scalar strings), in a traced map."""
    fns, _ = build_ops([OpConfig.model_validate(op) for op in ops])
    dataset = tf.data.Dataset.from_tensor_slices(columns).map(apply_ops(fns))
    return [{k: v.numpy().tolist() for k, v in e.items()} for e in dataset]


def as_one_batch(ops: list[dict], columns: dict) -> list[dict]:
    """The ops on the whole batch at once (a [B, None] RaggedTensor, or a [B] vector of strings), in a traced
    map; the rows come back as one dict per example."""
    fns, _ = build_ops([OpConfig.model_validate(op) for op in ops])
    (batch,) = list(tf.data.Dataset.from_tensors(columns).map(apply_ops(fns)))
    assert all(isinstance(v, tf.RaggedTensor) and v.shape.rank == 2 and v.ragged_rank == 1 for v in batch.values())
    rows = {k: v.to_list() for k, v in batch.items()}
    return [{k: rows[k][i] for k in rows} for i in range(len(next(iter(rows.values()))))]


def random_rows(seed: int, count: int = 24) -> list[list[int]]:
    """Lengths 0..9 (several empty rows), ids 0..3 (many zeros)."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 4, size=int(n)).tolist() for n in rng.integers(0, 10, size=count)]
    return rows + [[], [0], [0, 0]]


OP_CHAINS = [
    [{"op": "truncate", "max_length": 3}],
    [{"op": "truncate", "max_length": 3, "keep": "tail"}],
    [{"op": "truncate", "max_length": 1, "keep": "tail", "out_key": "last"}],
    [{"op": "lm_shift"}],
    [{"op": "lm_shift", "inputs_key": "x", "targets_key": "y", "keep": True}],
    [{"op": "append", "id": 0}],
    [{"op": "prepend", "id": 2}, {"op": "append", "id": 1, "out_key": "with_eos"}],
    [{"op": "truncate", "max_length": 4}, {"op": "append", "id": 1}, {"op": "lm_shift"}],  # the usual LM chain
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("splits", [tf.int32, tf.int64])  # parse_example gives int32 row splits, tf.ragged int64
@pytest.mark.parametrize("ops", OP_CHAINS, ids=lambda ops: "+".join(op["op"] for op in ops))
def test_an_op_on_a_ragged_batch_gives_each_row_what_its_example_gets_alone(ops, splits, seed):
    rows = random_rows(seed)
    assert [] in rows and any(0 in row for row in rows)
    dtype = tf.int64 if seed else tf.int32
    tokens = tf.ragged.constant(rows, dtype=dtype, ragged_rank=1, row_splits_dtype=splits)
    alone = one_by_one(ops, {"tokens": tokens})
    batched = as_one_batch(ops, {"tokens": tokens})
    assert batched == alone and len(batched) == len(rows)


@pytest.mark.parametrize("offset", [3, 0])
def test_tokenize_bytes_on_a_batch_of_strings_gives_a_ragged_row_per_string(offset):
    rng = np.random.default_rng(2)
    texts = TEXTS + ["".join(rng.choice(list("ab\x00é日🙂 "), size=int(n))) for n in rng.integers(0, 40, size=12)]
    columns = {"text": tf.constant([t.encode("utf-8") for t in texts])}
    ops = [{"op": "tokenize_bytes", "offset": offset, "out_key": "tokens"}, {"op": "append", "id": 1},
           {"op": "keep", "keys": ["tokens"]}]
    batched = as_one_batch(ops, columns)
    assert batched == one_by_one(ops, columns)
    assert [bytes(i - offset for i in e["tokens"][:-1]).decode("utf-8") for e in batched] == texts


def test_tokenize_bytes_on_an_empty_batch_and_a_batch_of_empty_strings():
    fns, _ = build_ops([OpConfig.model_validate({"op": "tokenize_bytes"})])
    for texts in ([], [b"", b""]):
        out = tf.function(lambda t: fns[0]({"text": t}))(tf.constant(texts, tf.string, shape=[len(texts)]))["text"]
        assert isinstance(out, tf.RaggedTensor) and out.dtype == tf.int32 and out.to_list() == [[] for _ in texts]


@pytest.mark.parametrize("op", [{"op": "truncate", "max_length": 2}, {"op": "lm_shift"}, {"op": "append", "id": 1},
                                {"op": "prepend", "id": 1}])
def test_a_dense_rank_2_batch_is_refused_in_one_line(op):
    """[B, L] (a padded batch: its 0s look like tokens) and one example's [T, d] feature list look alike."""
    fns, _ = build_ops([OpConfig.model_validate(op)])
    for dense in (tf.zeros([4, 6], tf.int32), tf.TensorSpec([None, None], tf.int32)):
        with pytest.raises(ConfigError) as error:
            tf.function(lambda t: fns[0]({"tokens": t})).get_concrete_function(dense)
        message = str(error.value)
        assert "\n" not in message, message
        assert f"op '{op['op']}': feature 'tokens' has shape" in message, message
        assert "a sequence op takes one example's 1-D ids or a ragged batch [B, None]" in message, message
    deeper = tf.RaggedTensor.from_row_lengths(tf.zeros([6, 2], tf.int32), [4, 2])  # [B, None, 2]: no row of ids
    with pytest.raises(ConfigError, match=r"is a RaggedTensor of shape \(2, None, 2\) .*ragged batch \[B, None\]"):
        fns[0]({"tokens": deeper})


def test_the_sequence_ops_are_batchable_so_the_plan_may_parse_whole_batches():
    """The plan's `auto` parses whole batches when every op is batchable (whether data.sequence lets it is the
    plan's business); the ops then meet [B, None] RaggedTensors, as the tests below feed them."""
    for name in ("truncate", "lm_shift", "append", "prepend", "tokenize_bytes"):
        assert get_op(name).batchable, name


def test_without_data_sequence_the_plan_parses_whole_batches_for_a_ragged_feature_and_the_sequence_ops(token_file):
    ops = [{"op": "truncate", "max_length": 3}, {"op": "append", "id": 1}, {"op": "lm_shift"}]
    pipeline = pipeline_of(token_config(token_file, batch_size=len(ROWS), preprocess=ops))
    assert pipeline.plan.parse.value == "batched" and pipeline.plan.ops_batchable
    (batch,) = list(pipeline.build())
    assert set(batch) == {"inputs", "targets", "id"} and isinstance(batch["inputs"], tf.RaggedTensor)
    assert batch["inputs"].to_list() == [(row[:3] + [1])[:-1] for row in ROWS]
    assert batch["targets"].to_list() == [(row[:3] + [1])[1:] for row in ROWS]


@pytest.mark.parametrize("kind", ["ragged", "sequence"])
def test_batched_parse_then_the_ops_on_real_records_equal_the_per_example_path(tmp_path, kind):
    """Serialized tf.Examples (or SequenceExamples) batched as bytes, parsed with one call and transformed as a
    ragged batch, against the same records parsed and transformed one at a time."""
    rows = random_rows(3, count=37)
    records = token_examples(rows) if kind == "ragged" else sequence_examples(rows)
    path = write_records(str(tmp_path / f"{kind}.tfrecord"), records)
    features = config_from_dict({"data": token_config(path, features={
        "tokens": {"dtype": "int64", "kind": kind}, "id": {"dtype": "int64"}})}).data.features
    ops = [OpConfig.model_validate(op) for op in
           [{"op": "prepend", "id": 2}, {"op": "truncate", "max_length": 5}, {"op": "append", "id": 0},
            {"op": "lm_shift", "keep": True}]]
    fns, _ = build_ops(ops)
    batched_parse, single_parse = make_parser(features, batched=True), make_parser(features)
    records = tf.data.TFRecordDataset(path)

    got = []
    for batch in records.batch(8).map(lambda serialized: apply_ops(fns)(batched_parse(serialized))):
        assert isinstance(batch["tokens"], tf.RaggedTensor) and batch["tokens"].dtype == tf.int32
        lists = {k: v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist() for k, v in batch.items()}
        got += [{k: lists[k][i] for k in lists} for i in range(len(lists["id"]))]
    alone = [{k: v.numpy().tolist() for k, v in e.items()}
             for e in records.map(lambda serialized: apply_ops(fns)(single_parse(serialized)))]
    assert got == alone and len(got) == len(rows)
    assert [e["inputs"] for e in got] == [([2] + row)[:5] for row in rows]
    assert [e["targets"] for e in got] == [([2] + row)[:5][1:] + [0] for row in rows]


def test_tokenize_bytes_on_a_batch_parsed_at_once_through_a_pipeline(tmp_path):
    records = [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")]))})) for text in TEXTS]
    path = write_records(str(tmp_path / "text.tfrecord"), records)
    config = token_config(path, features={"text": {"dtype": "string"}}, batch_size=len(TEXTS),
                          preprocess=[{"op": "tokenize_bytes", "out_key": "tokens"},
                                      {"op": "keep", "keys": ["tokens"]}])
    pipeline = pipeline_of(config)
    assert pipeline.plan.parse.value == "batched"
    (batch,) = list(pipeline.build())
    assert isinstance(batch["tokens"], tf.RaggedTensor) and batch["tokens"].dtype == tf.int32
    assert [bytes(i - 3 for i in row).decode("utf-8") for row in batch["tokens"].to_list()] == TEXTS


# --- bad arguments: one line naming the op and the argument ------------------------------------------------------

@pytest.mark.parametrize("op, fragments", [
    ({"op": "truncate", "max_length": 0}, ["op 'truncate'", "max_length must be an integer >= 1, got 0"]),
    ({"op": "truncate", "max_length": True}, ["op 'truncate'", "max_length must be an integer"]),
    ({"op": "truncate", "max_length": 4, "keep": "middle"},
     ["op 'truncate'", "keep must be head or tail, got 'middle'"]),
    ({"op": "lm_shift", "inputs_key": "x", "targets_key": "x"}, ["op 'lm_shift'", "inputs_key and targets_key"]),
    ({"op": "lm_shift", "keep": "yes"}, ["op 'lm_shift'", "keep must be true or false"]),
    ({"op": "lm_shift", "keep": True, "inputs_key": "tokens"}, ["op 'lm_shift'", "keep: true keeps 'tokens'"]),
    ({"op": "append", "id": "eos"}, ["op 'append'", "id must be an integer, got 'eos'"]),
    ({"op": "prepend", "id": 1.5}, ["op 'prepend'", "id must be an integer"]),
    ({"op": "tokenize_bytes", "offset": -1}, ["op 'tokenize_bytes'", "offset must be an integer >= 0"]),
    ({"op": "append"}, ["bad arguments for op 'append'", "missing a required argument: 'id'"]),
    ({"op": "truncate", "max_length": 4, "key": 3}, ["op 'truncate'", "key must be a feature name"]),
])
def test_bad_op_arguments_are_one_line_errors_at_build(token_file, op, fragments):
    with pytest.raises(ConfigError) as error:
        pipeline_of(token_config(token_file, preprocess=[op]))
    message = str(error.value)
    assert "\n" not in message and message.startswith("data.preprocess[0]"), message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("features, op, fragments", [
    ({"text": {"dtype": "string"}}, {"op": "truncate", "key": "text", "max_length": 2},
     ["op 'truncate': feature 'text' has shape ()", "not a 1-D sequence", "; use tokenize_bytes for text"]),
    ({"tokens": {"dtype": "float32", "kind": "ragged"}}, {"op": "append", "id": 1},
     ["op 'append': feature 'tokens' is float32, not integer token ids"]),
    ({"tokens": {"dtype": "int64", "kind": "ragged"}}, {"op": "append", "id": 1 << 40},
     ["op 'append': id 1099511627776 does not fit the feature 'tokens' (int32)"]),
    ({"tokens": {"dtype": "int64", "kind": "ragged"}}, {"op": "tokenize_bytes", "key": "tokens"},
     ["op 'tokenize_bytes': feature 'tokens' is int32 with shape (None,), not one string per example"]),
    ({"tokens": {"dtype": "int64", "kind": "ragged"}, "inputs": {"dtype": "int64"}}, {"op": "lm_shift"},
     ["op 'lm_shift': feature(s) ['inputs'] exist already"]),
    ({"tokens": {"dtype": "int64", "kind": "ragged"}}, {"op": "truncate", "max_length": 2, "key": "text"},
     ["op 'truncate': feature 'text' does not exist at this point of the pipeline; features here: tokens"]),
    ({"tokens": {"dtype": "int64", "shape": [2, 2]}}, {"op": "truncate", "max_length": 1},
     ["op 'truncate': feature 'tokens' has shape (2, 2)", "not a 1-D sequence",
      "a sequence op takes one example's 1-D ids or a ragged batch [B, None]"]),
])
def test_an_op_on_a_feature_it_cannot_take_is_refused_at_build(tmp_path, features, op, fragments):
    path = write_records(str(tmp_path / "x.tfrecord"), [tf.train.Example()])
    for spec in features.values():  # the one record is empty: every feature has a default
        spec["default"] = ("" if spec["dtype"] == "string" else [] if spec.get("kind") == "ragged" else
                           [0] * 4 if spec.get("shape") else 0)
    config = token_config(path, features=features, preprocess=[op], parse="per_example")
    with pytest.raises(ConfigError) as error:
        pipeline_of(config).build()
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("feature, fragment", [
    ({"dtype": "int64", "kind": "ragged", "shape": [3]}, "data.features.tokens: kind ragged is one 1-D "
                                                         "vector of any length per example, so shape must be []"),
    ({"dtype": "int64", "kind": "ragged", "default": [0]}, "data.features.tokens: kind ragged takes only "
                                                           "default: []"),
    ({"dtype": "int64", "cast": "int32"}, "data.features.tokens: cast applies to int64 features of kind "
                                          "ragged or sequence"),
    ({"dtype": "float32", "kind": "sequence", "cast": "int64"}, "cast applies to int64 features"),
    ({"dtype": "int64", "kind": "ragged", "cast": "int16"},
     "data.features.tokens.cast='int16': must be 'int32' or 'int64'"),
])
def test_feature_spec_errors_name_the_feature(token_file, feature, fragment):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"data": token_config(token_file, features={"tokens": feature})})
    assert fragment in str(error.value), str(error.value)


def test_the_tpu_check_points_a_token_sequence_at_data_sequence():
    (ragged,) = tpu_problems({"tokens": tf.RaggedTensorSpec([8, None], tf.int32, ragged_rank=1)})
    (dense,) = tpu_problems({"tokens": tf.TensorSpec([8, None], tf.int32)})
    for problem in (ragged, dense):
        assert "data.sequence: {keys: [tokens], length: N, mode: pad|bucket|pack}" in problem, problem
