"""`tpu-pipeline convert --from parquet` and `--from hf` on real files written by the `datasets` package.

The fixtures are what a user holds: Parquet files named and laid out as the Hugging Face hub lays them
out (`data/train-00000-of-00002.parquet`, per-config folders, a README.md with `configs:`), written by
`datasets.Dataset.to_parquet` (so the schema carries datasets' `huggingface` metadata, ClassLabel names
included), and folders written by `save_to_disk`. Every check is by content: the text decoded back byte
for byte, the image bytes equal to the column's bytes, every row exactly once.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import datasets  # noqa: E402  (the test extra installs it: it writes the fixtures; missing is a failure)

pytestmark = pytest.mark.tf_independent

datasets.disable_progress_bars()

from tpu_pipeline.errors import ConfigError, DataError  # noqa: E402
from tpu_pipeline.format import dataset_tokenizer  # noqa: E402
from tpu_pipeline.records import ConvertOptions, convert, read_metadata  # noqa: E402
from tpu_pipeline.records.convert import STATE_DIR  # noqa: E402
from tpu_pipeline.records.table_input import TableSource  # noqa: E402
from tpu_pipeline.records.token_records import TokenRecords, token_examples, tokens_example  # noqa: E402
from tpu_pipeline.format.tokenizer import ByteTokenizer, IdsTokenizer  # noqa: E402

from helpers import kill_convert_after_shards  # noqa: E402
from test_convert_text import cli  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(progress=False, workers=2)
CLASSES = ["cat", "dog", "emu"]


def texts(count: int, seed: int = 0) -> list[str]:
    """Documents of varied length and script; every 9th one empty (counted, not written)."""
    rng = np.random.default_rng(seed)
    words = ["the", "héllo", "wörld", "日本語", "😀👍🏽", "naïve", "\n", "tab\t", "Ελληνικά", "x" * 40]
    return ["" if i % 9 == 4 else f"doc {i}: " + " ".join(rng.choice(words, size=int(rng.integers(1, 60))))
            for i in range(count)]


def write_parquet(path, columns: dict, features=None, rows_per_group: int = 7) -> None:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path), batch_size=rows_per_group)


def hub_text_dataset(root, count: int = 120) -> dict[str, list[str]]:
    """data/{train,validation,test}-NNNNN-of-NNNNN.parquet, as push_to_hub names them; returns split → texts."""
    docs = texts(count)
    splits = {"train": docs[:80], "validation": docs[80:100], "test": docs[100:]}
    write_parquet(root / "data" / "train-00000-of-00002.parquet", {"text": splits["train"][:50], "id": list(range(50))})
    write_parquet(root / "data" / "train-00001-of-00002.parquet", {"text": splits["train"][50:], "id": list(range(50, 80))})
    write_parquet(root / "data" / "validation-00000-of-00001.parquet", {"text": splits["validation"], "id": list(range(80, 100))})
    write_parquet(root / "data" / "test-00000-of-00001.parquet", {"text": splits["test"], "id": list(range(100, count))})
    return splits


def images(count: int, seed: int = 0) -> list[bytes]:
    """Real JPEG and PNG bytes of varied sizes."""
    rng = np.random.default_rng(seed)
    result = []
    for i in range(count):
        pixels = rng.integers(0, 256, size=(8 + i % 5, 10 + i % 7, 3), dtype=np.uint8)
        result.append((tf.io.encode_png(pixels) if i % 3 == 0 else tf.io.encode_jpeg(pixels, quality=90)).numpy())
    return result


def records(out, split: str) -> list[tf.train.Example]:
    metadata = read_metadata(str(out))
    found = []
    for name in metadata["splits"][split]["files"]:
        for raw in tf.data.TFRecordDataset(os.path.join(str(out), name)):
            found.append(tf.train.Example.FromString(raw.numpy()))
    assert len(found) == metadata["splits"][split]["num_examples"] == sum(metadata["splits"][split]["counts"])
    return found


def decoded(out, split: str) -> list[str]:
    tokenizer = dataset_tokenizer(str(out))
    result = []
    for example in records(out, split):
        ids = list(example.features.feature["tokens"].int64_list.value)
        assert ids[-1] == tokenizer.eos_id and tokenizer.eos_id not in ids[:-1]
        result.append(tokenizer.decode(ids))
    return result


def ints(example: tf.train.Example, key: str) -> list[int]:
    return list(example.features.feature[key].int64_list.value)


def one(example: tf.train.Example, key: str):
    value = example.features.feature[key]
    kind = value.WhichOneof("kind")
    return getattr(value, kind).value[0]


# --- the records themselves ---------------------------------------------------------------------


def test_token_records_are_the_bytes_protobuf_writes():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 300_000, size=int(rng.integers(1, 500))) for _ in range(50)]
    docs += [np.array([0, 127, 128, 16_383, 16_384, 2**35, 2**63 - 1]), np.array([-1, -2**63, 5])]
    flat = np.concatenate(docs)
    bounds = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    assert token_examples(flat, bounds) == [tokens_example(d.tolist()) for d in docs]
    # With more features per record: a valid Example holding both.
    others = [tf.train.Features(feature={"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})
              .SerializeToString() for i in range(len(docs))]
    for i, raw in enumerate(token_examples(flat, bounds, others)):
        example = tf.train.Example.FromString(raw)
        assert ints(example, "tokens") == docs[i].tolist() and ints(example, "label") == [i]
    # Many documents at once, split in parts, equal the one-document path of --from text.
    encoder = TokenRecords(ByteTokenizer(), max_record_tokens=50)
    many = texts(40) + ["y" * 120, "日本語のテキスト" * 30, "plain ascii {braces} ~tilde~ " * 9]  # each varint path
    assert encoder.encode_many(many) == [encoder.encode_ids(ByteTokenizer().encode(t), len(t.encode())) for t in many]
    ids = TokenRecords(IdsTokenizer(1000), max_record_tokens=0)
    lists = [[1, 2, 999], [], [0]]
    flat = np.array([i for doc in lists for i in doc])
    offsets = np.array([0, 3, 3, 4])
    assert ids.encode_flat(flat, offsets, None) == [ids.encode_ids(doc, None) for doc in lists]


# --- text -------------------------------------------------------------------------------------


def test_hub_layout_text_round_trip_every_row_once(tmp_path, capsys):
    splits = hub_text_dataset(tmp_path / "ds")
    out = tmp_path / "out"
    code, stdout, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "ds"), "--text_field", "text",
                               "--out", str(out), "--min_shards", "3", "--noprogress")
    assert code == 0, stderr
    metadata = read_metadata(str(out))
    assert list(metadata["splits"]) == ["test", "train", "validation"]
    assert metadata["source"]["splits_from"] == "file names {split}-NNNNN-of-NNNNN"
    for split, docs in splits.items():
        written = [d for d in docs if d]
        assert collections.Counter(decoded(out, split)) == collections.Counter(written)  # byte for byte, each once
        entry = metadata["splits"][split]
        assert entry["num_documents"] == len(written) and entry["num_empty"] == len(docs) - len(written)
        assert entry["num_text_bytes"] == sum(len(d.encode()) for d in docs)
        assert entry["num_tokens"] == sum(len(d.encode()) + 1 for d in written)
        assert len(entry["files"]) == 3
    assert "train: 71 documents" in stdout and "9 empty document(s)" in stdout
    assert "split: train}" in stdout  # the summary's config line names train


def test_shuffled_order_is_a_pure_function_of_the_position(tmp_path):
    """Resume reads from a shard's first position: the rows from any position equal the tail of the whole
    stream (windows of several row groups, rows shuffled across them)."""
    hub_text_dataset(tmp_path / "ds", count=300)
    source = TableSource(str(tmp_path / "ds"), text_field="text", keep_fields=["id"], shuffle_window_mb=0.005)
    windows, _ = source.order.windows("train")
    assert len(windows) > 2 and max(map(len, windows)) > 1  # several windows of several row groups
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        whole = [r.records for r, _ in source.encode_stream("train", 0, executor, 2)]
        for start in (1, 17, 60, len(whole) - 1):
            assert [r.records for r, _ in source.encode_stream("train", start, executor, 2)] == whole[start:]
    ids = [ints(tf.train.Example.FromString(r[0]), "id")[0] for r in whole if r]
    assert sorted(ids) == [i for i in range(80) if i % 9 != 4] and ids != sorted(ids)
    unshuffled = TableSource(str(tmp_path / "ds"), text_field="text", keep_fields=["id"], shuffle=False)
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        in_order = [r.records for r, _ in unshuffled.encode_stream("train", 0, executor, 2)]
    ids = [ints(tf.train.Example.FromString(r[0]), "id")[0] for r in in_order if r]
    assert ids == [i for i in range(80) if i % 9 != 4]  # file order


def test_sentencepiece_and_label_on_text(tmp_path):
    from test_convert_text import train_spm

    model = train_spm(tmp_path, 300, "small")
    docs = ["the cat sat on the mat", "the owl ran to the café 7", "Zürich 😀", "the dog"] * 5
    write_parquet(tmp_path / "ds" / "train.parquet", {"text": docs, "label": ["pos", "neg"] * 10}, rows_per_group=6)
    out = tmp_path / "out"
    metadata = convert(TableSource(str(tmp_path / "ds"), text_field="text", label_field="label", tokenizer=f"spm:{model}"),
                       str(out), ConvertOptions(min_shards=2, **FAST)).metadata
    assert metadata["tokenizer"]["type"] == "sentencepiece" and metadata["extra_files"] == ["tokenizer.model"]
    assert metadata["class_names"] == ["neg", "pos"]
    tokenizer = dataset_tokenizer(str(out))
    pairs = [(tokenizer.decode(ints(e, "tokens")), one(e, "label_name").decode()) for e in records(out, "train")]
    assert collections.Counter(pairs) == collections.Counter(zip(docs, ["pos", "neg"] * 10))


def test_ids_column_and_bad_ids(tmp_path, capsys):
    lists = [[int(i) for i in np.arange(n) * 7 % 500] for n in range(1, 31)]
    write_parquet(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet", {"ids": lists}, rows_per_group=4)
    out = tmp_path / "out"
    code, _, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "ds"), "--ids_field", "ids", "--vocab_size", "500",
                          "--out", str(out), "--noprogress", "--min_shards", "2")
    assert code == 0, stderr
    assert sorted(ints(e, "tokens") for e in records(out, "train")) == sorted(lists)
    assert read_metadata(str(out))["tokenizer"] == {"type": "ids", "vocab_size": 500, "special_ids": {}}
    code, _, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "ds"), "--ids_field", "ids", "--vocab_size", "100",
                          "--out", str(tmp_path / "out2"), "--noprogress", "--noshuffle")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    # Row 15 (ids 0, 7, ..., 105) is the first with an id past 100; rows 12-15 are row group 3.
    assert ("data/train-00000-of-00001.parquet: row group 3, row 15: id 105 (position 15) is outside [0, 100) "
            "(--vocab_size 100)") in stderr and "--on_error=skip" in stderr


# --- images and labels --------------------------------------------------------------------------


def image_features():
    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                              "caption": datasets.Value("string"), "score": datasets.Value("float32"),
                              "flag": datasets.Value("bool")})


def image_columns(count: int, seed: int = 0) -> dict:
    data = images(count, seed)
    return {"image": [{"bytes": b, "path": f"img{i}.{'png' if i % 3 == 0 else 'jpg'}"} for i, b in enumerate(data)],
            "label": [i % 3 for i in range(count)], "caption": [f"caption {i} ✓" for i in range(count)],
            "score": [i / 4 for i in range(count)], "flag": [i % 2 == 0 for i in range(count)]}


def check_images(out, split: str, columns: dict) -> None:
    expected = {c: (b["bytes"], lab, cap, s, f) for b, lab, cap, s, f in
                zip(columns["image"], columns["label"], columns["caption"], columns["score"], columns["flag"])
                for c in [cap]}
    seen = []
    for example in records(out, split):
        caption = one(example, "caption").decode()
        data, label, _, score, flag = expected[caption]
        assert one(example, "image") == data  # the column's bytes, never re-encoded
        assert one(example, "label") == label and one(example, "label_name").decode() == CLASSES[label]
        assert one(example, "score") == pytest.approx(score) and one(example, "flag") == int(flag)
        decoded_image = tf.io.decode_image(data)
        assert (one(example, "height"), one(example, "width")) == tuple(decoded_image.shape[:2])
        seen.append(caption)
    assert sorted(seen) == sorted(columns["caption"])  # every row exactly once


def test_images_from_save_to_disk_with_class_label_names(tmp_path, capsys):
    train, test = image_columns(23), image_columns(9, seed=1)
    test["caption"] = [c.replace("caption", "test caption") for c in test["caption"]]
    dataset = datasets.DatasetDict({"train": datasets.Dataset.from_dict(train, features=image_features()),
                                    "test": datasets.Dataset.from_dict(test, features=image_features())})
    dataset.save_to_disk(str(tmp_path / "saved"), num_shards={"train": 2, "test": 1})
    out = tmp_path / "out"
    code, stdout, stderr = cli(capsys, "--from", "hf", str(tmp_path / "saved"), "--image_field", "image",
                               "--label_field", "label", "--keep_fields", "caption,score,flag", "--out", str(out),
                               "--noprogress", "--min_shards", "2")
    assert code == 0, stderr
    metadata = read_metadata(str(out))
    assert metadata["class_names"] == CLASSES and metadata["source"]["format"] == "arrow"
    assert metadata["features"] == {"image": {"dtype": "string"}, "height": {"dtype": "int64"}, "width": {"dtype": "int64"},
                                    "label": {"dtype": "int64"}, "label_name": {"dtype": "string"},
                                    "caption": {"dtype": "string"}, "score": {"dtype": "float32"},
                                    "flag": {"dtype": "int64"}}
    check_images(out, "train", train)
    check_images(out, "test", test)
    assert "classes (3): cat, dog, emu" in stdout


def test_string_labels_become_class_ids_from_parquet(tmp_path):
    columns = image_columns(20)
    columns["label"] = [CLASSES[i % 3] for i in range(20)]
    write_parquet(tmp_path / "ds" / "train" / "0000.parquet", {"image": columns["image"], "label": columns["label"]},
                  features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")}),
                  rows_per_group=6)
    out = tmp_path / "out"
    metadata = convert(TableSource(str(tmp_path / "ds"), image_field="image", label_field="label"), str(out),
                       ConvertOptions(min_shards=2, **FAST)).metadata
    assert metadata["class_names"] == CLASSES and metadata["source"]["splits_from"].startswith("folder names")
    found = collections.Counter((one(e, "image"), one(e, "label"), one(e, "label_name").decode())
                                for e in records(out, "train"))
    assert found == collections.Counter((b["bytes"], i % 3, CLASSES[i % 3]) for i, b in enumerate(columns["image"]))


# --- bad rows -----------------------------------------------------------------------------------


def test_nulls_and_images_by_path_raise_naming_file_row_group_and_row_or_are_skipped(tmp_path, capsys):
    docs = texts(30)
    docs[13] = None
    write_parquet(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet", {"text": docs}, rows_per_group=5)
    code, _, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "ds"), "--text_field", "text",
                          "--out", str(tmp_path / "out"), "--noprogress")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert ("data/train-00000-of-00001.parquet: row group 2, row 13: column 'text' is null; fill it. Fix or remove "
            "it and run the same command again") in stderr
    assert stderr.count("--on_error=skip") == 1, stderr  # the fix is said once
    assert not (tmp_path / "out" / "metadata.json").exists()
    code, stdout, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "ds"), "--text_field", "text",
                               "--out", str(tmp_path / "out"), "--noprogress", "--on_error", "skip")
    assert code == 0, stderr
    entry = read_metadata(str(tmp_path / "out"))["splits"]["train"]
    assert [s["where"] for s in entry["skipped"]] == ["data/train-00000-of-00001.parquet: row group 2, row 13"]
    assert collections.Counter(decoded(tmp_path / "out", "train")) == collections.Counter(d for d in docs if d)
    assert "skipped 1 unreadable item(s)" in stdout
    # An image column whose row holds a path only (the image lives outside the file), and bytes that are no image.
    columns = image_columns(12)
    columns["image"][4] = {"bytes": None, "path": "/elsewhere/4.jpg"}
    columns["image"][7] = {"bytes": b"not an image at all", "path": None}
    write_parquet(tmp_path / "img" / "train.parquet", columns, features=image_features(), rows_per_group=5)
    with pytest.raises(DataError, match=r"train.parquet: row group 0, row 4: column 'image' holds no image bytes "
                                        r"\(path '/elsewhere/4.jpg'\)"):
        convert(TableSource(str(tmp_path / "img"), image_field="image", shuffle=False), str(tmp_path / "o2"),
                ConvertOptions(**FAST))
    metadata = convert(TableSource(str(tmp_path / "img"), image_field="image", label_field="label"), str(tmp_path / "o3"),
                       ConvertOptions(on_error="skip", **FAST)).metadata
    skipped = {s["where"]: s["reason"] for s in metadata["splits"]["train"]["skipped"]}
    assert set(skipped) == {"train.parquet: row group 0, row 4", "train.parquet: row group 1, row 7"}
    assert "not a JPEG, PNG, GIF, BMP or WebP image" in skipped["train.parquet: row group 1, row 7"]
    assert metadata["splits"]["train"]["num_examples"] == 10


def test_nested_and_missing_columns_are_refused_in_one_line(tmp_path):
    write_parquet(tmp_path / "ds" / "train.parquet", {"text": ["a", "b"], "tags": [["x"], ["y", "z"]],
                                                       "meta": [{"k": 1}, {"k": 2}], "label": [-1, 0]})
    root = str(tmp_path / "ds")
    with pytest.raises(ConfigError, match=r"--keep_fields tags: column 'tags' of train.parquet is list<element: string>, "
                                          r"a nested type; only scalar columns"):
        TableSource(root, text_field="text", keep_fields=["tags"])
    with pytest.raises(ConfigError, match=r"--keep_fields meta: .* a nested type"):
        TableSource(root, text_field="text", keep_fields=["meta"])
    with pytest.raises(ConfigError, match=r"--text_field tags: column 'tags' of train.parquet is list<element: string>, not strings"):
        TableSource(root, text_field="tags")
    with pytest.raises(ConfigError, match=r"train.parquet has no column\(s\) \['body'\]; its columns: text \(string\)"):
        TableSource(root, text_field="body")
    with pytest.raises(ConfigError, match="name the columns to convert"):
        TableSource(root)
    with pytest.raises(DataError, match=r"label -1 in column 'label' is not a class id in 0 or more \(-1 is datasets' "
                                        "mark of an unlabeled row"):
        convert(TableSource(root, text_field="text", label_field="label"), str(tmp_path / "out"), ConvertOptions(**FAST))


# --- splits and configs ---------------------------------------------------------------------------


def test_splits_cut_one_split_and_pick_or_rename_several(tmp_path, capsys):
    docs = [d for d in texts(200) if d]
    write_parquet(tmp_path / "one" / "data" / "train-00000-of-00001.parquet", {"text": docs}, rows_per_group=9)
    out = tmp_path / "cut"
    metadata = convert(TableSource(str(tmp_path / "one"), text_field="text", splits="train=0.9,validation=0.1"),
                       str(out), ConvertOptions(min_shards=2, **FAST)).metadata
    assert metadata["splits"]["train"]["num_documents"] == round(0.9 * len(docs))
    assert metadata["splits"]["validation"]["num_documents"] == len(docs) - round(0.9 * len(docs))
    cut = decoded(out, "train") + decoded(out, "validation")
    assert collections.Counter(cut) == collections.Counter(docs)  # every row once, over both splits
    assert metadata["splits"]["validation"]["source_split"] == "train"
    splits = hub_text_dataset(tmp_path / "three")
    out = tmp_path / "picked"
    metadata = convert(TableSource(str(tmp_path / "three"), text_field="text", splits="train,eval=validation"),
                       str(out), ConvertOptions(min_shards=1, **FAST)).metadata
    assert list(metadata["splits"]) == ["eval", "train"]
    assert collections.Counter(decoded(out, "eval")) == collections.Counter(d for d in splits["validation"] if d)
    with pytest.raises(ConfigError, match=r"fractions cut a dataset of one split, and .* has 3 \(train, validation, test\)"):
        TableSource(str(tmp_path / "three"), text_field="text", splits="train=0.5,validation=0.5")
    with pytest.raises(ConfigError, match="has no split 'dev'; its splits: train, validation, test"):
        TableSource(str(tmp_path / "three"), text_field="text", splits="train,validation=dev")


def test_split_names_follow_the_rules_of_datasets():
    from tpu_pipeline.records.tables.hub_layout import splits_by_name

    assert splits_by_name(["data/train-00000-of-00002.parquet", "data/train-00001-of-00002-5ad1c3e9.parquet",
                           "data/test_sft-00000-of-00001.parquet"])[:2] == (
        {"train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002-5ad1c3e9.parquet"],
         "test_sft": ["data/test_sft-00000-of-00001.parquet"]}, "file names {split}-NNNNN-of-NNNNN")
    assert splits_by_name(["default/train/0000.parquet", "default/validation/0000.parquet", "dev-set/a.parquet"])[0] == {
        "train": ["default/train/0000.parquet"], "validation": ["default/validation/0000.parquet", "dev-set/a.parquet"]}
    found, _, left_out = splits_by_name(["my_train.parquet", "test.parquet", "latest.parquet", "notes.parquet"])
    assert found == {"train": ["my_train.parquet"], "test": ["test.parquet"]}
    assert left_out == ["latest.parquet", "notes.parquet"]  # named in the summary and metadata.json
    assert splits_by_name(["a.parquet", "b.parquet"])[0] == {"train": ["a.parquet", "b.parquet"]}


def test_configs_from_readme_and_from_folders(tmp_path):
    for config, offset in (("cola", 0), ("sst2", 100)):
        for split, count in (("train", 12), ("validation", 5)):
            write_parquet(tmp_path / "hub" / config / f"{split}-00000-of-00001.parquet",
                          {"sentence": [f"{config} {split} {i}" for i in range(count)],
                           "label": [(offset + i) % 2 for i in range(count)]},
                          features=datasets.Features({"sentence": datasets.Value("string"),
                                                      "label": datasets.ClassLabel(names=["unacceptable", "acceptable"])}))
    root = str(tmp_path / "hub")
    with pytest.raises(ConfigError, match=r"holds one folder per config \(cola, sst2\); pick one with --hf_config NAME"):
        TableSource(root, text_field="sentence")
    source = TableSource(root, text_field="sentence", label_field="label", config="sst2")
    assert source.split_sizes() == {"train": 12, "validation": 5} and source.class_names() == ["unacceptable", "acceptable"]
    # The README.md that push_to_hub writes names each config's files: it wins over the folder names.
    (tmp_path / "hub" / "README.md").write_text(
        "---\nconfigs:\n- config_name: cola\n  data_files:\n  - split: train\n    path: cola/train-*\n"
        "  - split: validation\n    path: cola/validation-*\n  default: true\n- config_name: sst2\n  data_files:\n"
        "  - split: train\n    path: sst2/train-*\n---\n# GLUE\n")
    out = tmp_path / "out"
    metadata = convert(TableSource(root, text_field="sentence"), str(out), ConvertOptions(min_shards=1, **FAST)).metadata
    assert metadata["source"]["config"] == "cola" and metadata["source"]["splits_from"] == "README.md config 'cola'"
    assert sorted(decoded(out, "validation")) == sorted(f"cola validation {i}" for i in range(5))
    assert TableSource(root, text_field="sentence", config="sst2").split_sizes() == {"train": 12}
    with pytest.raises(ConfigError, match="--hf_config qnli: .* names the configs cola, sst2"):
        TableSource(root, text_field="sentence", config="qnli")


def test_a_save_to_disk_folder_needs_from_hf(tmp_path, capsys):
    datasets.Dataset.from_dict({"text": ["a", "b", "c"]}).save_to_disk(str(tmp_path / "one"))
    code, _, stderr = cli(capsys, "--from", "parquet", str(tmp_path / "one"), "--text_field", "text",
                          "--out", str(tmp_path / "out"), "--noprogress")
    assert code == 2 and "was written by datasets' save_to_disk" in stderr and "--from hf" in stderr
    code, _, stderr = cli(capsys, "--from", "hf", str(tmp_path / "one"), "--text_field", "text",
                          "--out", str(tmp_path / "out"), "--noprogress", "--min_shards", "1")
    assert code == 0, stderr
    assert sorted(decoded(tmp_path / "out", "train")) == ["a", "b", "c"]
    code, _, stderr = cli(capsys, "--from", "csv", str(tmp_path / "x.csv"), "--image_field", "image",
                          "--out", str(tmp_path / "out3"))
    assert code == 2 and "--image_field: only with --from parquet or hf" in stderr


# --- through the pipeline, and after a kill -------------------------------------------------------


def test_converted_tokens_and_images_read_through_the_pipeline(tmp_path):
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline

    splits = hub_text_dataset(tmp_path / "text")
    convert(TableSource(str(tmp_path / "text"), text_field="text"), str(tmp_path / "corpus"),
            ConvertOptions(min_shards=2, **FAST))
    data = config_from_dict({"data": {"source": {"type": "tfrecord", "dir": str(tmp_path / "corpus"), "split": "train"},
                                      "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
                                      "preprocess": [{"op": "lm_shift", "key": "tokens"}],
                                      "sequence": {"keys": ["inputs", "targets"], "length": 64, "mode": "pack"},
                                      "shuffle": {"enabled": False}, "repeat": 1, "batch_size": 4,
                                      "drop_remainder": False}}).data
    tokens = 0
    for batch in Pipeline.from_config(data).build():
        tokens += int(tf.reduce_sum(tf.cast(batch["inputs_segment_ids"] > 0, tf.int64)))
    assert tokens == sum(len(d.encode()) for d in splits["train"] if d)  # every token of every document, shifted once
    columns = image_columns(16)
    write_parquet(tmp_path / "img" / "data" / "train-00000-of-00001.parquet", columns, features=image_features())
    convert(TableSource(str(tmp_path / "img"), image_field="image", label_field="label"), str(tmp_path / "images"),
            ConvertOptions(min_shards=2, **FAST))
    data = config_from_dict({"data": {"source": {"type": "tfrecord", "dir": str(tmp_path / "images"), "split": "train"},
                                      "image_size": [8, 8], "shuffle": {"enabled": False}, "repeat": 1,
                                      "batch_size": 4}}).data
    labels = []
    for inputs, targets in Pipeline.from_config(data).build():
        assert inputs.shape == (4, 8, 8, 3)
        labels += targets.numpy().tolist()
    assert sorted(labels) == sorted(columns["label"])


@pytest.mark.slow
def test_killed_conversion_resumes_with_every_row_once(tmp_path):
    splits = hub_text_dataset(tmp_path / "ds", count=200)
    out = tmp_path / "out"
    args = ["--from", "parquet", str(tmp_path / "ds"), "--text_field", "text", "--out", str(out),
            "--target_shard_mb", "0.0001", "--min_shards", "1", "--workers", "2", "--noprogress",
            "--shuffle_window_mb", "0.002"]
    kill_convert_after_shards(args, out, tmp_path / "killed.log")
    assert not (out / "metadata.json").exists() and not list(out.glob("*.tfrecord"))
    finished = len(list((out / STATE_DIR).glob("*.tfrecord.json")))
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = int(result.stdout.split("kept ")[1].split()[0])
    assert kept >= finished > 0
    for split, docs in splits.items():
        assert collections.Counter(decoded(out, split)) == collections.Counter(d for d in docs if d)
    # The same command without the kill writes the same shards, byte for byte.
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args[:5], "--out", str(fresh), *args[7:]],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    metadata = read_metadata(str(out))
    for split, entry in metadata["splits"].items():
        for name in entry["files"]:
            assert (out / name).read_bytes() == (fresh / name).read_bytes()
