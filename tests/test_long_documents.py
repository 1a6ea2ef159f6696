"""Documents far longer than a row are counted and explained once (issue 25, item 2's warnings):
`convert` (which knows no row length) warns about documents over LONG_DOCUMENT_TOKENS tokens, `doctor`
about examples over FAR_LONGER x data.sequence.length; each in one line naming the count, the longest
and what the pipeline does with them, never one line per document. `convert` stores such a document as
records of at most MAX_RECORD_TOKENS ids (its parts), so that reading one costs bounded memory."""
from __future__ import annotations

import json

import pytest
import tensorflow as tf

from tpu_pipeline.bench.sequence_advice import FAR_LONGER, long_examples
from tpu_pipeline.commands.convert import long_documents_line, summary
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.format.record_limits import MAX_RECORD_TOKENS
from tpu_pipeline.format.tokenizer import load_tokenizer
from tpu_pipeline.records import ConvertOptions, convert
from tpu_pipeline.records.text_input import LONG_DOCUMENT_TOKENS, TextSource

pytestmark = pytest.mark.tf_builds

LONG = [LONG_DOCUMENT_TOKENS + 10, 2 * LONG_DOCUMENT_TOKENS, LONG_DOCUMENT_TOKENS]  # bytes; +1 EOS each


def _convert(directory, max_record_tokens: int):
    path = directory / "docs.jsonl"
    with open(path, "w") as handle:
        for size, letter in zip(LONG, "xyz"):
            handle.write(json.dumps({"text": letter * size}) + "\n")
        for index in range(40):
            handle.write(json.dumps({"text": f"a short document, number {index}"}) + "\n")
    out = str(directory / "out")
    source = TextSource([str(path)], text_field="text", splits="train=0.8,validation=0.2",
                        max_record_tokens=max_record_tokens)
    return out, convert(source, out, ConvertOptions(min_shards=2, progress=False))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Converted as a user would (parts of MAX_RECORD_TOKENS)."""
    return _convert(tmp_path_factory.mktemp("long"), MAX_RECORD_TOKENS)


@pytest.fixture(scope="module")
def whole_corpus(tmp_path_factory):
    """One record per document however long (--max_record_tokens 0, or a dataset converted before parts)."""
    return _convert(tmp_path_factory.mktemp("whole"), 0)


def test_convert_counts_the_long_documents_and_says_it_in_one_line(corpus):
    out, result = corpus
    splits = result.metadata["splits"]
    # A document of exactly LONG_DOCUMENT_TOKENS bytes is LONG_DOCUMENT_TOKENS + 1 tokens (its EOS): long too.
    assert sum(entry["num_long_documents"] for entry in splits.values()) == 3
    longest = max(entry["longest_document_tokens"] for entry in splits.values())
    assert longest == 2 * LONG_DOCUMENT_TOKENS + 1
    where = max(splits, key=lambda name: splits[name]["longest_document_tokens"])
    text = summary(result.metadata, out, result.shards_written, 0, False)
    warnings = [line for line in text.splitlines() if "warning" in line]
    assert warnings == [long_documents_line(result.metadata)] == [
        f"  warning: 3 document(s) have more than {LONG_DOCUMENT_TOKENS:,} tokens (the longest {longest:,}, in {where}); "
        f"each is stored as records of at most {MAX_RECORD_TOKENS:,} tokens, read as separate examples (no attention "
        "across them); in training, data.sequence.overflow: split cuts each into chunks of data.sequence.length "
        "tokens, each its own segment (no attention across chunks), and overflow: truncate keeps each record's "
        "first length tokens"]


def test_a_long_document_is_stored_as_bounded_records_in_order_with_one_eos(corpus):
    out, result = corpus
    tokenizer = load_tokenizer("bytes")
    documents, records = [], 0
    for split, entry in result.metadata["splits"].items():
        current: list[int] = []
        for name in entry["files"]:
            for raw in tf.data.TFRecordDataset(f"{out}/{name}").as_numpy_iterator():
                ids = list(tf.train.Example.FromString(raw).features.feature["tokens"].int64_list.value)
                assert 0 < len(ids) <= MAX_RECORD_TOKENS
                assert tokenizer.eos_id not in ids[:-1]  # EOS only where a document ends
                records += 1
                current += ids
                if ids[-1] == tokenizer.eos_id:
                    documents.append(tokenizer.decode(current))
                    current = []
        assert current == []  # no document's parts run past its shard
        assert entry["num_examples"] == sum(entry["counts"])
    metadata = result.metadata
    assert records == sum(entry["num_examples"] for entry in metadata["splits"].values())
    assert sum(entry["num_documents"] for entry in metadata["splits"].values()) == len(documents) == 43
    assert sum(entry["num_split_documents"] for entry in metadata["splits"].values()) == 3
    assert records == 40 + 2 + 3 + 2  # 65,547, 131,073 and 65,537 tokens in parts of 65,536
    assert sorted(len(d) for d in documents if d[0] in "xyz") == sorted(LONG)  # each long document whole, in order
    assert all(set(d) == {d[0]} for d in documents if d[0] in "xyz")
    assert metadata["max_record_tokens"] == MAX_RECORD_TOKENS


def test_whole_documents_stay_one_record_each_with_zero(whole_corpus):
    _, result = whole_corpus
    splits = result.metadata["splits"].values()
    assert sum(entry["num_examples"] for entry in splits) == 43
    assert sum(entry["num_split_documents"] for entry in splits) == 0
    assert "stored as records" not in long_documents_line(result.metadata)


def test_no_long_document_no_warning():
    metadata = {"splits": {"train": {"num_long_documents": 0, "longest_document_tokens": 12}}}
    assert long_documents_line(metadata) == ""


@pytest.mark.parametrize("overflow", ["split", "truncate"])
def test_doctor_counts_examples_far_longer_than_the_row(whole_corpus, overflow):
    out, _ = whole_corpus
    length = 256
    data = {"source": {"type": "tfrecord", "dir": out, "split": "train"},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged", "cast": "int32"}},
            "batch_size": 4, "shuffle": {"enabled": False}, "drop_remainder": False,
            "sequence": {"keys": ["tokens"], "length": length, "mode": "pack", "overflow": overflow}}
    config = config_from_dict({"data": data}).data
    found = long_examples(config, "tokens", length)
    seen_long = [n for n in (size + 1 for size in LONG) if n > FAR_LONGER * length]
    in_train = found.count  # the split decides which of the three landed in train
    assert found is not None and 1 <= in_train <= len(seen_long) and found.seen >= in_train
    assert found.longest in (size + 1 for size in LONG) and found.overflow == overflow
    line = found.line(length)
    assert line.startswith(f"  warning: {in_train:,} of the {found.seen:,} examples seen are over {FAR_LONGER} x length")
    assert ("cuts each into chunks of 256 tokens" in line) == (overflow == "split"), line
    assert ("keeps only the first 256 tokens of each" in line) == (overflow == "truncate"), line
    assert long_examples(config, "tokens", 10 * max(LONG)) is None  # nothing far longer: no line
    # A record longer than convert writes today (one per document, however long) is named, with the fix.
    assert ("convert it again" in line) == (found.longest > MAX_RECORD_TOKENS), line


def test_doctor_sees_the_parts_of_a_document_converted_today(corpus):
    out, _ = corpus
    data = {"source": {"type": "tfrecord", "dir": out, "split": "train"},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged", "cast": "int32"}},
            "batch_size": 4, "shuffle": {"enabled": False}, "drop_remainder": False,
            "sequence": {"keys": ["tokens"], "length": 256, "mode": "pack"}}
    found = long_examples(config_from_dict({"data": data}).data, "tokens", 256)
    assert found is not None and found.longest <= MAX_RECORD_TOKENS
    assert "convert it again" not in found.line(256)
