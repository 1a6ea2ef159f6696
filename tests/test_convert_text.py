"""`tpu-pipeline convert --from text` on real files: text, JSON lines, pre-tokenized ids, SentencePiece.

Every round trip reads the written TFRecords back and decodes them with the dataset's own tokenizer
(`dataset_tokenizer(out)`), comparing with the original documents byte for byte. The interrupted
conversion is a real CLI process killed with SIGKILL, then run again.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml
from absl import flags

from tpu_pipeline.cli import main
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format import dataset_tokenizer, load_tokenizer
from tpu_pipeline.format import tokenizer as tokenizer_module
from tpu_pipeline.ops import token_ops as sequence_ops
from tpu_pipeline.pipeline import source_from_config
from tpu_pipeline.records import ConvertOptions, TextSource, convert, read_metadata
from tpu_pipeline.records.convert import STATE_DIR

from helpers import kill_convert_after_shards

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(progress=False, workers=2)
DOCUMENTS = {
    "plain.txt": "The quick brown fox jumps over the lazy dog.",
    "accents.txt": "héllo wörld — naïve café, 日本語のテキスト, Ελληνικά",
    "emoji.txt": "emoji 😀👍🏽 and a family 👨\u200d👩\u200d👧 end",
    "crlf.txt": "first line\r\nsecond line\r\n",
    "spaces.txt": "  leading and trailing spaces   \n\n\t tab  ",
}


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The real entry point, in this process: (exit code, stdout, stderr). Flags are reset after it."""
    try:
        main(["tpu-pipeline", "convert", *args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    finally:
        flags.FLAGS.unparse_flags()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(path, content: str | bytes) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)


def read_ids(out, split: str) -> list[list[int]]:
    """Every record's `tokens` in a split, in file order."""
    metadata = read_metadata(str(out))
    rows = []
    for name in metadata["splits"][split]["files"]:
        for raw in tf.data.TFRecordDataset(os.path.join(str(out), name), compression_type=metadata["compression"]):
            example = tf.train.Example.FromString(raw.numpy())
            assert list(example.features.feature) == ["tokens"]
            rows.append(list(example.features.feature["tokens"].int64_list.value))
    return rows


def decoded(out) -> list[str]:
    """Every document of every split, decoded with the dataset's recorded tokenizer (EOS checked)."""
    tokenizer = dataset_tokenizer(str(out))
    texts = []
    for split in read_metadata(str(out))["splits"]:
        for ids in read_ids(out, split):
            if tokenizer.eos_id is not None:
                assert ids[-1] == tokenizer.eos_id and tokenizer.eos_id not in ids[:-1]
            texts.append(tokenizer.decode(ids))
    return texts


def check_counts(metadata: dict, out) -> None:
    """Per-shard token counts and per-split sums agree with the records themselves."""
    for split, entry in metadata["splits"].items():
        per_shard = [sum(len(ids) for ids in read_ids_file(out, name, metadata)) for name in entry["files"]]
        assert entry["tokens"] == per_shard
        assert entry["num_tokens"] == sum(per_shard)
        assert entry["num_documents"] == entry["num_examples"] == sum(entry["counts"])
        assert len(entry["tokens"]) == len(entry["files"]) == len(entry["bytes"])


def read_ids_file(out, name: str, metadata: dict) -> list[list[int]]:
    dataset = tf.data.TFRecordDataset(os.path.join(str(out), name), compression_type=metadata["compression"])
    return [list(tf.train.Example.FromString(r.numpy()).features.feature["tokens"].int64_list.value) for r in dataset]


def test_byte_offset_matches_the_tokenize_bytes_op():
    assert tokenizer_module.BYTE_OFFSET == sequence_ops.BYTE_OFFSET == 3
    text = DOCUMENTS["emoji.txt"] + DOCUMENTS["accents.txt"]
    op_ids = sequence_ops.tokenize_bytes()({"text": tf.constant(text)})["text"].numpy().tolist()
    tokenizer = load_tokenizer("bytes")
    assert tokenizer.encode(text) == op_ids
    assert tokenizer.decode([0] + op_ids + [1, 2]) == text  # pad, EOS and UNK are dropped
    assert tokenizer.describe() == {"type": "bytes", "vocab_size": 259, "offset": 3,
                                    "special_ids": {"pad": 0, "eos": 1, "unk": 2}}


def test_cli_round_trip_of_several_paths_a_glob_and_a_directory(tmp_path, capsys):
    files = [write(tmp_path / "in" / name, text) for name, text in DOCUMENTS.items()]
    write(tmp_path / "dir" / "nested" / "deep.txt", "from a nested directory ✓")
    write(tmp_path / "dir" / "top.txt", "from the directory's top")
    write(tmp_path / "dir" / "empty.txt", "")
    write(tmp_path / "dir" / "notes.md", "not *.txt: a directory gives only its *.txt files")
    write(tmp_path / "glob" / "g1.txt", "first of the glob")
    write(tmp_path / "glob" / "g2.txt", "second of the glob")
    out = tmp_path / "out"
    code, stdout, stderr = cli(capsys, "--from", "text", *files, str(tmp_path / "dir"), str(tmp_path / "glob" / "g*.txt"),
                               files[0], "--out", str(out), "--splits", "train=0.75,validation=0.25", "--min_shards", "2",
                               "--noprogress")
    assert code == 0, stderr
    expected = list(DOCUMENTS.values()) + ["from a nested directory ✓", "from the directory's top",
                                           "first of the glob", "second of the glob"]
    assert collections.Counter(decoded(out)) == collections.Counter(expected)  # each file once, byte for byte
    metadata = read_metadata(str(out))
    assert metadata["features"] == {"tokens": {"dtype": "int64", "kind": "ragged"}}
    assert metadata["tokenizer"] == {"type": "bytes", "vocab_size": 259, "offset": 3,
                                     "special_ids": {"pad": 0, "eos": 1, "unk": 2}}
    assert metadata["source"]["num_files"] == 10 and metadata["source"]["num_documents"] == 10
    splits = metadata["splits"]
    assert sum(s["num_empty"] for s in splits.values()) == 1
    assert sum(s["num_documents"] for s in splits.values()) == 9
    assert sum(s["num_text_bytes"] for s in splits.values()) == sum(len(t.encode()) for t in expected)
    assert sum(s["num_tokens"] for s in splits.values()) == sum(len(t.encode()) + 1 for t in expected)  # + EOS
    check_counts(metadata, out)
    assert sorted(os.listdir(out)) == sorted(["metadata.json"] + [f for s in splits.values() for f in s["files"]])
    for split, entry in splits.items():
        assert (f"{split}: {entry['num_documents']:,} documents, {entry['num_tokens']:,} tokens in "
                f"{len(entry['files'])} shard(s)") in stdout
        said = f"{entry['num_empty']:,} empty document(s)"
        assert (said in stdout) == (entry["num_empty"] > 0), stdout  # mentioned only when there are some
    line = stdout.split("read it with:")[1].strip()
    assert line == (f"data: {{source: {{type: tfrecord, dir: {out}, split: train}}, "
                    "features: {tokens: {dtype: int64, kind: ragged}}}")
    config = config_from_dict({"data": {**yaml.safe_load(line)["data"], "batch_size": 2}}).data  # the line works
    assert source_from_config(config).info().num_examples == splits["train"]["num_examples"]
    # The same command again: finished, nothing rewritten.
    code, stdout, _ = cli(capsys, "--from", "text", *files, str(tmp_path / "dir"), str(tmp_path / "glob" / "g*.txt"),
                          "--out", str(out), "--splits", "train=0.75,validation=0.25", "--min_shards", "2", "--noprogress")
    assert code == 0 and "already holds this dataset" in stdout


def test_document_per_line(tmp_path):
    path = write(tmp_path / "lines.txt", "\ufeffone\r\ntwo  \n\nthree 😀\n\n   \nlast without newline")
    write(tmp_path / "more.txt", "another\n")
    out = tmp_path / "out"
    source = TextSource([str(tmp_path)], document_per_line=True, splits="train=0.5,validation=0.5", seed=1)
    metadata = convert(source, str(out), ConvertOptions(min_shards=2, **FAST)).metadata
    # The BOM and the line ending are not text; a blank line is an empty document, counted; spaces are text.
    expected = ["one", "two  ", "three 😀", "   ", "last without newline", "another"]
    assert collections.Counter(decoded(out)) == collections.Counter(expected)
    assert sum(s["num_empty"] for s in metadata["splits"].values()) == 2
    assert metadata["source"]["num_documents"] == 8 and metadata["source"]["document_per_line"] is True
    check_counts(metadata, out)
    assert path in TextSource([path], document_per_line=True).where(0)


def test_jsonl_text_field_errors_name_file_and_line_or_are_skipped(tmp_path):
    rows = [{"text": "first ✓", "id": 1}, {"text": "tab\tand \"quotes\"\nnewline", "id": 2}, {"text": ""},
            {"text": "emoji 🎉"}]
    body = "\n".join(json.dumps(row, ensure_ascii=i % 2 == 0) for i, row in enumerate(rows))
    good = write(tmp_path / "good.jsonl", body + "\n\n")  # a blank line: an empty document, counted
    bad = write(tmp_path / "bad.json", '{"text": "fine"}\n{"text": "broken\n{"other": "x"}\n["a list"]\n')
    out = str(tmp_path / "out")
    source = TextSource([good, bad], text_field="text")
    with pytest.raises(DataError, match=f"cannot convert {bad}:[234]: .*--on_error=skip"):
        convert(source, out, ConvertOptions(min_shards=1, **FAST))
    assert read_metadata(out) is None
    metadata = convert(source, out, ConvertOptions(min_shards=1, on_error="skip", **FAST)).metadata
    split = metadata["splits"]["train"]
    assert sorted(s["where"] for s in split["skipped"]) == [f"{bad}:2", f"{bad}:3", f"{bad}:4"]
    reasons = {s["where"]: s["reason"] for s in split["skipped"]}
    assert reasons[f"{bad}:2"].startswith("not valid JSON")
    assert reasons[f"{bad}:3"].startswith("no field 'text' (its fields: ['other'])")
    assert reasons[f"{bad}:4"] == "a JSON list where one object per line is expected"
    assert split["num_skipped"] == 3 and split["num_empty"] == 2
    assert collections.Counter(decoded(out)) == collections.Counter(["first ✓", rows[1]["text"], "emoji 🎉", "fine"])
    assert split["num_text_bytes"] == sum(len(t.encode()) for t in ["first ✓", rows[1]["text"], "emoji 🎉", "fine"])


def test_ids_field_checks_the_vocabulary(tmp_path, capsys):
    rows = [[5, 6, 7], [], [0, 99], [1, 2, 3, 4]]
    path = write(tmp_path / "ids.jsonl", "".join(json.dumps({"ids": ids}) + "\n" for ids in rows)
                 + json.dumps({"ids": [3, 100, 4]}) + "\n" + json.dumps({"ids": [1, "2"]}) + "\n")
    out = tmp_path / "out"
    args = ["--from", "text", path, "--ids_field", "ids", "--vocab_size", "100", "--out", str(out), "--noprogress",
            "--min_shards", "2"]
    code, _, stderr = cli(capsys, *args)
    assert code == 2 and (f"cannot convert {path}:5: id 100 (position 1) is outside [0, 100) (--vocab_size 100)"
                          in stderr or f"cannot convert {path}:6: field 'ids' must be a list of integers" in stderr)
    assert len(stderr.strip().splitlines()) == 1 and read_metadata(str(out)) is None
    code, stdout, stderr = cli(capsys, *args, "--on_error", "skip")
    assert code == 0, stderr
    assert "skipped 2 unreadable item(s)" in stdout and f"{path}:6: field 'ids' must be a list of integers" in stdout
    assert f"{path}:5: id 100 (position 1) is outside [0, 100)" in stdout
    metadata = read_metadata(str(out))
    assert metadata["tokenizer"] == {"type": "ids", "vocab_size": 100, "special_ids": {}}
    split = metadata["splits"]["train"]
    assert "num_text_bytes" not in split and split["num_empty"] == 1 and split["num_tokens"] == 9
    assert sorted(read_ids(out, "train")) == sorted(ids for ids in rows if ids)  # as given: no EOS appended
    assert dataset_tokenizer(str(out)).decode([5, 6, 7]) == "5 6 7"
    check_counts(metadata, out)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    write(tmp_path / "good.txt", "fine text")
    bad = write(tmp_path / "latin1.txt", "line one\ncafé in Latin-1".encode("latin-1"))
    source = TextSource([str(tmp_path)])
    with pytest.raises(DataError, match=f"cannot convert {bad}: not UTF-8 text .* on line 2"):
        convert(source, str(tmp_path / "a"), ConvertOptions(**FAST))
    metadata = convert(source, str(tmp_path / "b"), ConvertOptions(on_error="skip", **FAST)).metadata
    assert [s["where"] for s in metadata["splits"]["train"]["skipped"]] == [bad]
    assert decoded(tmp_path / "b") == ["fine text"]
    per_line = TextSource([bad], document_per_line=True)
    metadata = convert(per_line, str(tmp_path / "c"), ConvertOptions(on_error="skip", **FAST)).metadata
    assert [s["where"] for s in metadata["splits"]["train"]["skipped"]] == [f"{bad}:2"]


def test_killed_conversion_resumes(tmp_path):
    texts = [f"document {i}: " + "ü" * (i * 7) for i in range(24)]
    for i, text in enumerate(texts):
        write(tmp_path / "corpus" / f"{i:02d}.txt", text)
    out = tmp_path / "out"
    args = ["--from", "text", str(tmp_path / "corpus"), "--out", str(out), "--target_shard_mb", "0.00001",
            "--min_shards", "1", "--workers", "2", "--noprogress"]
    kill_convert_after_shards(args, out, tmp_path / "killed.log")
    state = out / STATE_DIR
    assert not (out / "metadata.json").exists() and not list(out.glob("*.tfrecord*"))
    finished = len(list(state.glob("*.tfrecord.json")))
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = int(result.stdout.split("kept ")[1].split()[0])
    assert kept >= finished and f"wrote {24 - kept} shard(s)" in result.stdout
    assert not state.exists()
    metadata = read_metadata(str(out))
    assert len(metadata["splits"]["train"]["files"]) == 24
    assert sorted(decoded(out)) == sorted(texts)
    check_counts(metadata, out)


def train_spm(tmp_path, vocab_size: int, name: str, model_type: str = "unigram") -> str:
    import sentencepiece as spm  # the `text` extra, which scripts/setup_env.sh installs: missing is a failure
    corpus = tmp_path / f"{name}-train.txt"
    lines = [f"the {w} sat on the mat and the {w} ran to the café {i}" for i, w in
             enumerate(["cat", "dog", "emu", "fox", "owl", "yak"] * 20)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = str(tmp_path / name)
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
        normalization_rule_name="identity", remove_extra_whitespaces=False, byte_fallback=True,
        character_coverage=1.0, pad_id=3, minloglevel=2, num_threads=1, hard_vocab_limit=False,
    )
    return prefix + ".model"


def pieces(model: str) -> int:
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=model).get_piece_size()


def test_sentencepiece_round_trip_copies_the_model(tmp_path, capsys):
    model = train_spm(tmp_path, 300, "small")
    texts = {"a.txt": "the cat sat on the mat", "b.txt": "unseen words: Zürich 😀 日本\r\nand  two  spaces ",
             "c.txt": "the owl ran to the café 7"}
    files = [write(tmp_path / "docs" / name, text) for name, text in texts.items()]
    out = tmp_path / "out"
    code, stdout, stderr = cli(capsys, "--from", "text", *files, "--tokenizer", f"spm:{model}", "--out", str(out),
                               "--noprogress", "--min_shards", "1")
    assert code == 0, stderr
    metadata = read_metadata(str(out))
    assert metadata["tokenizer"] == {"type": "sentencepiece", "model_file": "tokenizer.model", "vocab_size": pieces(model),
                                     "special_ids": {"unk": 0, "bos": 1, "eos": 2, "pad": 3}}
    assert metadata["extra_files"] == ["tokenizer.model"]
    with open(model, "rb") as original, open(out / "tokenizer.model", "rb") as copied:
        assert original.read() == copied.read()
    assert "model copied to tokenizer.model" in stdout
    os.rename(model, model + ".moved")  # the dataset decodes with its own copy
    assert collections.Counter(decoded(out)) == collections.Counter(texts.values())
    check_counts(metadata, out)
    os.rename(out / "tokenizer.model", tmp_path / "aside.model")
    with pytest.raises(DataError, match="tokenizer.model, which is missing"):
        dataset_tokenizer(str(out))
    os.rename(tmp_path / "aside.model", out / "tokenizer.model")
    ids = read_ids(out, "train")
    assert sum(map(len, ids)) < sum(len(t.encode()) for t in texts.values())  # subwords, not one id per byte
    # Another model is other input even where its vocab_size and special ids are the same: its hash is in
    # the fingerprint, so the finished dataset is not taken for this one.
    other = train_spm(tmp_path, 300, "other", model_type="bpe")
    assert load_tokenizer(f"spm:{other}").describe() == metadata["tokenizer"]
    with pytest.raises(DataError, match="already holds a finished dataset"):
        convert(TextSource(files, tokenizer=f"spm:{other}"), str(out), ConvertOptions(min_shards=1, **FAST))
    metadata = convert(TextSource(files, tokenizer=f"spm:{other}"), str(out),
                       ConvertOptions(min_shards=1, overwrite=True, **FAST)).metadata
    assert metadata["tokenizer"]["vocab_size"] == pieces(other)
    assert collections.Counter(decoded(out)) == collections.Counter(texts.values())
    # --overwrite with the byte tokenizer removes the copied model.
    convert(TextSource(files), str(out), ConvertOptions(min_shards=1, overwrite=True, **FAST))
    assert not (out / "tokenizer.model").exists()


def test_missing_sentencepiece_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # what `import` does when it is not installed
    with pytest.raises(ConfigError) as error:
        load_tokenizer("spm:some/model.model")
    assert str(error.value) == ("--tokenizer spm:...: needs the sentencepiece package: "
                                "pip install 'tpu_pipeline[text]'")


@pytest.mark.parametrize("args, message", [
    (["--ids_field", "ids"], "--ids_field needs --vocab_size N"),
    (["--text_field", "t", "--ids_field", "ids", "--vocab_size", "9"], "--text_field and --ids_field: give one"),
    (["--vocab_size", "9"], "--vocab_size: only with --ids_field"),
    (["--text_field", "t", "--document_per_line"], "--document_per_line: JSON lines are one document per line"),
    (["--tokenizer", "wordpiece"], "--tokenizer: 'wordpiece' is not a tokenizer; give bytes, spm:"),
    (["--tokenizer", "spm:/no/such.model"], "--tokenizer spm:/no/such.model: no such file"),
    (["JSONL"], "is JSON lines: pass --text_field NAME"),
    (["MISSING"], "does not exist"),
    (["--splits", "train=0.5,validation=0.4"], "--splits: the fractions add up to 0.9"),
])
def test_flag_errors_are_one_line(tmp_path, capsys, args, message):
    text = write(tmp_path / "a.txt", "text")
    write(tmp_path / "b.jsonl", '{"t": "x"}\n')
    args = [str(tmp_path / "b.jsonl") if a == "JSONL" else str(tmp_path / "nope.txt") if a == "MISSING" else a
            for a in args]
    code, _, stderr = cli(capsys, "--from", "text", text, *args, "--out", str(tmp_path / "out"), "--noprogress")
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_command_level_errors(tmp_path, capsys):
    code, _, stderr = cli(capsys, "--from", "text", "--out", str(tmp_path / "out"))
    assert code == 2 and "--from text needs at least one input" in stderr
    csv = write(tmp_path / "a.csv", "x\n1\n")
    code, _, stderr = cli(capsys, "--from", "csv", csv, "--document_per_line", "--out", str(tmp_path / "out"))
    assert code == 2 and "--document_per_line: only with --from text" in stderr
    code, _, stderr = cli(capsys, "--from", "csv", csv, csv, "--out", str(tmp_path / "out"))
    assert code == 2 and "exactly one positional argument" in stderr
