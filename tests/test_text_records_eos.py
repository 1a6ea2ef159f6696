"""Every converted document ends with its tokenizer's EOS id, and metadata.json counts exactly those ids.

The expected ids come from the tokenizer library itself (sentencepiece's own processor, Python's
UTF-8 encoder), not from the package's tokenizer wrapper: a wrapper that lost its EOS id would
otherwise agree with itself. The model learns where a document ends from that EOS, and bits per byte
and the token counts that plan steps are computed from these records.
"""
from __future__ import annotations

import collections

import pytest

from tpu_pipeline.records import ConvertOptions, TextSource, convert, read_metadata

from test_convert_text import read_ids, train_spm, write

pytestmark = pytest.mark.tf_independent

TEXTS = ["the cat sat on the mat", "unseen words: Zürich 😀 日本 and  two  spaces ", "the owl ran to the café 7",
         "a", "the yak and the emu ran to the mat and sat on the cat", "dog " * 40]


def _expected(tokenizer: str, model: str | None) -> tuple[list[list[int]], int]:
    """(each document's ids + EOS, the EOS id), from the tokenizer library directly."""
    if tokenizer == "bytes":
        eos = 1  # ByT5's layout: pad 0, EOS 1, UNK 2, byte b → b + 3
        return [[b + 3 for b in text.encode("utf-8")] + [eos] for text in TEXTS], eos
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=model)
    eos = processor.eos_id()
    assert eos >= 0, "the test model has an EOS id"
    return [list(processor.encode(text, out_type=int)) + [eos] for text in TEXTS], eos


@pytest.mark.parametrize("tokenizer", ["sentencepiece", "bytes"])
def test_every_record_ends_with_eos_and_num_tokens_counts_them(tmp_path, tokenizer):
    model = train_spm(tmp_path, 300, "eos") if tokenizer == "sentencepiece" else None
    files = [write(tmp_path / "docs" / f"{index}.txt", text) for index, text in enumerate(TEXTS)]
    out = str(tmp_path / "out")
    source = TextSource(files, splits="train=0.5,validation=0.5", tokenizer=f"spm:{model}" if model else "bytes")
    convert(source, out, ConvertOptions(min_shards=2, progress=False, workers=2))
    expected, eos = _expected(tokenizer, model)

    metadata = read_metadata(out)
    records = {split: read_ids(out, split) for split in metadata["splits"]}
    for split, rows in records.items():
        assert rows and all(row[-1] == eos and eos not in row[:-1] for row in rows), (split, rows)
        assert metadata["splits"][split]["num_tokens"] == sum(len(row) for row in rows)
        assert metadata["splits"][split]["num_documents"] == len(rows)
    written = [row for rows in records.values() for row in rows]
    assert collections.Counter(map(tuple, written)) == collections.Counter(map(tuple, expected))
    assert sum(entry["num_tokens"] for entry in metadata["splits"].values()) == sum(
        len(ids) for ids in expected)  # Σ (len(encode(text)) + 1)
