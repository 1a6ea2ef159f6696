"""`verify`, `data.on_error: skip` and the first-fault scan on token data, as for images.

Real TFRecord shards of tf.train.Examples (`tokens`: int64 ids of any length, `id`: a fixed int64) in a
directory with the metadata.json `tpu-pipeline convert --from text` writes (its tokenizer says
vocab_size 259). One fault of each kind is planted at a known record of the second shard: an id equal
to vocab_size (the off-by-one), an id of -1, an empty document, ids stored as floats and as bytes, and
no `tokens` at all; the first shard holds vocab_size - 1 (the last good id) and 0.
"""
from __future__ import annotations

import collections
import json
import os
import random

import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import DataError
from tpu_pipeline.format.metadata import shard_name, write_metadata
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.verify import config_vocabulary, first_fault, verify_data

pytestmark = pytest.mark.tf_builds

VOCAB = 259
SHARDS, PER_SHARD, BAD_SHARD = 2, 14, 1
# record of the bad shard → (what is planted, the kind verify names)
PLANTS = {2: ("id_vocab", "token_out_of_vocab"), 4: ("empty", "empty_document"), 6: ("floats", "wrong_dtype"),
          8: ("bytes", "wrong_dtype"), 10: ("missing", "missing_feature"), 12: ("id_minus_1", "token_out_of_vocab")}
KINDS = {"empty_document": 1, "missing_feature": 1, "token_out_of_vocab": 2, "wrong_dtype": 2}
FEATURES = {"tokens": {"dtype": "int64", "kind": "ragged"}, "id": {"dtype": "int64"}}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_CACHE", str(tmp_path / "cache"))


def documents(count: int, seed: int = 0) -> list[list[int]]:
    """Token lists of 1..20 ids in 0..VOCAB-1; the fourth is [VOCAB - 1, 0] (both ends of the vocabulary)."""
    rng = random.Random(seed)
    docs = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))] for _ in range(count)]
    docs[3] = [VOCAB - 1, 0]
    return docs


def example(index: int, tokens: tf.train.Feature = None) -> bytes:
    feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[1000 + index]))}  # ids past VOCAB: not tokens
    if tokens is not None:
        feature["tokens"] = tokens
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def ints(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def planted_record(index: int, doc: list[int], plant: str) -> bytes:
    if plant == "id_vocab":
        return example(index, ints(doc[:1] + [VOCAB] + doc[1:]))  # at position 1
    if plant == "id_minus_1":
        return example(index, ints(doc + [-1]))
    if plant == "empty":
        return example(index, ints([]))
    if plant == "floats":
        return example(index, tf.train.Feature(float_list=tf.train.FloatList(value=[float(t) for t in doc])))
    if plant == "bytes":
        return example(index, tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(doc)])))
    return example(index)  # missing


def write_dataset(directory: str, plants: dict = PLANTS, tokenizer: bool = True) -> tuple[list[str], list[list[int]]]:
    """The shards and metadata.json of a converted text dataset; returns (shard paths, the good documents)."""
    os.makedirs(directory)
    docs = documents(SHARDS * PER_SHARD)
    names = [shard_name("train", i, SHARDS) for i in range(SHARDS)]
    good = []
    for shard, name in enumerate(names):
        with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
            for record in range(PER_SHARD):
                index = shard * PER_SHARD + record
                if shard == BAD_SHARD and record in plants:
                    writer.write(planted_record(index, docs[index], plants[record][0]))
                else:
                    writer.write(example(index, ints(docs[index])))
                    good.append(docs[index])
    metadata = {
        "format_version": 1, "name": "planted_text", "source": {"type": "text"}, "features": FEATURES,
        "class_names": None, "compression": "",
        "splits": {"train": {"files": names, "counts": [PER_SHARD] * SHARDS, "num_examples": SHARDS * PER_SHARD,
                             "num_skipped": 0, "skipped": []}},
    }
    if tokenizer:
        metadata["tokenizer"] = {"type": "bytes", "vocab_size": VOCAB, "offset": 3, "special_ids": {"pad": 0, "bos": 1,
                                                                                                      "eos": 2}}
    write_metadata(directory, metadata)
    return [os.path.join(directory, name) for name in names], good


def offsets(path: str) -> list[int]:
    """Byte offset of each record's header: 8 length + 4 CRC + data + 4 CRC each."""
    raw, found, at = open(path, "rb").read(), [], 0
    while at < len(raw):
        found.append(at)
        at += 16 + int.from_bytes(raw[at:at + 8], "little")
    return found


def data_config(directory: str, **overrides) -> dict:
    data = {"source": {"type": "tfrecord", "dir": directory, "split": "train", "shuffle_files": False},
            "shuffle": {"enabled": False}, "repeat": 1, "batch_size": 1, "outputs": None,
            "options": {"deterministic": True}}
    data.update(overrides)
    return data


@pytest.fixture
def planted(tmp_path):
    return write_dataset(str(tmp_path / "text"))


def test_verify_names_each_token_fault_by_file_record_and_byte(planted):
    paths, _ = planted
    report = verify_data(config_from_dict({"data": data_config(os.path.dirname(paths[0]))}).data, progress=False)
    bad, starts = paths[BAD_SHARD], offsets(paths[BAD_SHARD])
    assert [(f.file, f.record, f.offset, f.kind) for f in report.faults] == [
        (bad, record, starts[record], kind) for record, (_, kind) in sorted(PLANTS.items())], report.table()
    assert report.by_kind() == KINDS and report.records == SHARDS * PER_SHARD
    what = {f.record: f.what for f in report.faults}
    assert what[2] == f"token id {VOCAB} at position 1 of feature 'tokens' >= vocab_size {VOCAB} (metadata.json tokenizer)"
    assert what[12].startswith("token id -1 at position ") and what[12].endswith(" of feature 'tokens' < 0")
    assert what[4] == "feature 'tokens' holds no token id (an empty document)"
    assert what[6] == "feature 'tokens' stores float32 values where dtype is int64"
    assert what[8] == "feature 'tokens' stores string values where dtype is int64"
    assert what[10].startswith("has no feature 'tokens' (it has: id)")
    fix = {f.record: f.fix for f in report.faults}
    assert "convert again with the right tokenizer" in fix[2] and "token ids are int64 lists" in fix[6]
    table = report.table()
    assert f"data: token ids of 'tokens' checked against vocab_size {VOCAB} (metadata.json tokenizer)" in table
    assert f"{bad} | 2 | {starts[2]:,} | token id {VOCAB}" in table


def test_verify_command_prints_the_token_faults_and_exits_1(planted, tmp_path, capsys):
    import yaml
    from absl import flags

    from tpu_pipeline.cli import main

    paths, _ = planted
    config_path = tmp_path / "c.yaml"
    config_path.write_text(yaml.safe_dump({"data": data_config(os.path.dirname(paths[0]))}))
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["tpu-pipeline", "verify", "--config", str(config_path), "--json", str(tmp_path / "r.json")])
    finally:
        flags.FLAGS.unparse_flags()  # --config is a multi-flag: another in-process CLI call would layer this one
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"data: {SHARDS * PER_SHARD} records in {SHARDS} file(s): 6 fault(s) (empty_document 1, missing_feature 1, " \
           "token_out_of_vocab 2, wrong_dtype 2)" in out, out
    assert f"{paths[BAD_SHARD]} | 4 | " in out
    (report,) = json.load(open(tmp_path / "r.json"))
    assert report["faults_by_kind"] == KINDS
    assert {(f["file"], f["record"]) for f in report["faults"]} == {(paths[BAD_SHARD], r) for r in PLANTS}


def test_on_error_skip_yields_exactly_the_good_documents(planted):
    paths, good = planted
    data = data_config(os.path.dirname(paths[0]), on_error="skip", max_skipped=len(PLANTS))
    pipeline = Pipeline.from_config(config_from_dict({"data": data}).data)
    got = [batch["tokens"].to_list()[0] for batch in pipeline.build()]
    assert collections.Counter(map(tuple, got)) == collections.Counter(map(tuple, good))
    report = pipeline.skipped
    assert report.by_kind() == KINDS and report.by_file() == {paths[BAD_SHARD]: len(PLANTS)}
    assert report.as_dict() == {"records": SHARDS * PER_SHARD, "skipped": len(PLANTS), "faults_by_kind": KINDS,
                                "skipped_by_file": {paths[BAD_SHARD]: len(PLANTS)}}  # metrics.json's 'skipped'
    with pytest.raises(DataError, match=r"data.max_skipped=5: 6 of 28 records are bad .* the first: .*record 2 "):
        Pipeline.from_config(config_from_dict({"data": {**data, "max_skipped": 5}}).data)


def test_a_clean_token_dataset_verifies_clean(tmp_path):
    paths, good = write_dataset(str(tmp_path / "clean"), plants={})
    report = verify_data(config_from_dict({"data": data_config(os.path.dirname(paths[0]))}).data, progress=False)
    assert report.faults == [] and report.records == len(good) == SHARDS * PER_SHARD
    assert report.table().splitlines() == [
        f"data: {len(good)} records in {SHARDS} file(s): no fault found",
        f"data: token ids of 'tokens' checked against vocab_size {VOCAB} (metadata.json tokenizer)"]


def boundary_file(path: str) -> str:
    """Records 0..4: [VOCAB - 1] (the last id), [VOCAB] (one past), [-1], [0], []."""
    with tf.io.TFRecordWriter(path) as writer:
        for index, tokens in enumerate([[VOCAB - 1], [VOCAB], [-1], [0], []]):
            writer.write(example(index, ints(tokens)))
    return path


@pytest.mark.parametrize("sections, origin", [
    ({"model": {"transformer": {"vocab_size": VOCAB}}}, "model.transformer.vocab_size"),
    ({"train": {"task": "language_model", "num_classes": VOCAB}}, "train.num_classes"),
    ({"train": {"task": "classification", "num_classes": VOCAB}}, None),  # a class count is no vocabulary
    ({}, None),
])
def test_the_vocabulary_boundary_from_the_config(tmp_path, sections, origin):
    """A glob of files with no metadata.json: the vocabulary comes from the config, or is unknown (then only
    -1 and the empty document are faults, and the report says so once)."""
    path = boundary_file(str(tmp_path / "bound.tfrecord"))
    data = {"source": {"type": "tfrecord", "files": path}, "features": FEATURES, "batch_size": 1, "outputs": None}
    config = config_from_dict({"data": data, **sections})
    vocab = config_vocabulary(config)
    report = verify_data(config.data, progress=False, vocab=vocab)
    found = {(f.record, f.kind) for f in report.faults}
    expected = {(2, "token_out_of_vocab"), (4, "empty_document")} | ({(1, "token_out_of_vocab")} if origin else set())
    assert found == expected, report.table()
    if origin:
        assert vocab.origin == origin and report.notes == [f"token ids of 'tokens' checked against vocab_size {VOCAB} "
                                                           f"({origin})"]
        assert "set model.transformer.vocab_size to its vocabulary size" in report.faults[0].fix
    else:
        assert vocab is None and report.notes[0].startswith("token ids of 'tokens' not checked against a vocabulary: ")
    data["features"] = {**FEATURES, "tokens": {**FEATURES["tokens"], "default": []}}  # empty documents are meant
    report = verify_data(config_from_dict({"data": data}).data, progress=False, vocab=vocab)
    assert (4, "empty_document") not in {(f.record, f.kind) for f in report.faults}


def test_sequence_examples_are_token_features_and_fixed_integers_are_not(tmp_path):
    """A feature list of ids (kind sequence) is checked step by step; a fixed int64 (`label`) is not a token."""
    path = str(tmp_path / "seq.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for index, row in enumerate([[1, 2], [3, VOCAB + 5, 4], [5]]):
            record = tf.train.SequenceExample()
            record.context.feature["label"].int64_list.value.append(VOCAB * 10)
            for token in row:
                record.feature_lists.feature_list["tokens"].feature.add().int64_list.value.append(token)
            writer.write(record.SerializeToString())
    data = {"source": {"type": "tfrecord", "files": path}, "batch_size": 1, "outputs": None,
            "features": {"tokens": {"dtype": "int64", "kind": "sequence"}, "label": {"dtype": "int64"}}}
    from tpu_pipeline.format.vocabulary import Vocabulary

    (fault,) = verify_data(config_from_dict({"data": data}).data, progress=False, vocab=Vocabulary(VOCAB)).faults
    assert (fault.record, fault.kind) == (1, "token_out_of_vocab") and "position 1" in fault.what, fault.line()


def test_the_first_fault_scan_names_an_id_past_the_vocabulary_with_its_fix(tmp_path):
    """A token id past the vocabulary meets the embedding as TF's `indices[...] = 259 is not in [0, 259)`: the
    scan names the file, record and byte, and says how to fix it."""
    paths, _ = write_dataset(str(tmp_path / "text"), plants={2: PLANTS[2]})
    config = config_from_dict({"data": data_config(os.path.dirname(paths[0]))}).data
    fault = first_fault(config)
    assert (fault.file, fault.record, fault.kind) == (paths[BAD_SHARD], 2, "token_out_of_vocab")
    pipeline = Pipeline.from_config(config)
    embedding = tf.zeros([VOCAB, 2])
    with pytest.raises(DataError) as error:
        with pipeline.naming_data_errors():
            for batch in pipeline.build():
                tf.gather(embedding, batch["tokens"].flat_values)
    message = str(error.value)
    assert message.startswith(f"data: {paths[BAD_SHARD]}, record 2 (byte {offsets(paths[BAD_SHARD])[2]:,}): token id "
                              f"{VOCAB} at position 1 of feature 'tokens' >= vocab_size {VOCAB}"), message
    assert "convert again with the right tokenizer" in message and f"is not in [0, {VOCAB})" in message


def test_on_error_skip_takes_the_configs_vocabulary_where_no_metadata_names_one(tmp_path):
    path = boundary_file(str(tmp_path / "bound.tfrecord"))
    data = {"source": {"type": "tfrecord", "files": path}, "features": FEATURES, "batch_size": 1, "outputs": None,
            "repeat": 1, "shuffle": {"enabled": False}, "on_error": "skip", "max_skipped": 3}
    config = config_from_dict({"data": data, "model": {"transformer": {"vocab_size": VOCAB}}})
    pipeline = Pipeline.from_config(config.data, vocab=config_vocabulary(config))
    assert [batch["tokens"].to_list()[0] for batch in pipeline.build()] == [[VOCAB - 1], [0]]
    assert pipeline.skipped.by_kind() == {"empty_document": 1, "token_out_of_vocab": 2}
