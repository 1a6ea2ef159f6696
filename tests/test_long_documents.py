"""Documents far longer than a row are counted and explained once (issue 25, item 2's warnings):
`convert` (which knows no row length) warns about documents over LONG_DOCUMENT_TOKENS tokens, `doctor`
about examples over FAR_LONGER x data.sequence.length; each in one line naming the count, the longest
and what the pipeline does with them, never one line per document."""
from __future__ import annotations

import json

import pytest

from tpu_pipeline.bench.doctor import FAR_LONGER, long_examples
from tpu_pipeline.commands.convert import long_documents_line, summary
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.records import ConvertOptions, convert
from tpu_pipeline.records.text_source import LONG_DOCUMENT_TOKENS, TextSource

LONG = [LONG_DOCUMENT_TOKENS + 10, 2 * LONG_DOCUMENT_TOKENS, LONG_DOCUMENT_TOKENS]  # bytes; +1 EOS each


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long")
    path = directory / "docs.jsonl"
    with open(path, "w") as handle:
        for size in LONG:
            handle.write(json.dumps({"text": "x" * size}) + "\n")
        for index in range(40):
            handle.write(json.dumps({"text": f"a short document, number {index}"}) + "\n")
    out = str(directory / "out")
    result = convert(TextSource([str(path)], text_field="text", splits="train=0.8,validation=0.2"), out,
                     ConvertOptions(min_shards=2, progress=False))
    return out, result


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
        "in training, data.sequence.overflow: split cuts each into chunks of data.sequence.length tokens, each its "
        "own segment (no attention across chunks), and overflow: truncate keeps only its first length tokens"]


def test_no_long_document_no_warning():
    metadata = {"splits": {"train": {"num_long_documents": 0, "longest_document_tokens": 12}}}
    assert long_documents_line(metadata) == ""


@pytest.mark.parametrize("overflow", ["split", "truncate"])
def test_doctor_counts_examples_far_longer_than_the_row(corpus, overflow):
    out, _ = corpus
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
