"""`tpu-pipeline convert` on real files: image folders of real JPEG/PNG bytes, CSV and .npz files.

Round trips compare what the shards hold with the originals; the interrupted conversion is a real
process killed with SIGKILL mid-way, then run again.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.pipeline import Pipeline, make_parser, source_from_config
from tpu_pipeline.format import dir_features
from tpu_pipeline.records import ConvertOptions, convert, read_metadata
from tpu_pipeline.records.convert import STATE_DIR

from helpers import kill_convert_after_shards
from tpu_pipeline.records.csv_input import CsvSource
from tpu_pipeline.records.image_folder import ImageFolderSource
from tpu_pipeline.records.numpy_input import NumpySource
from tpu_pipeline.records.sharding import split_fractions

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ("cat", "dog", "emu")
FAST = dict(progress=False, workers=2)


def make_image_folder(root, per_class: int = 6, size: int = 20, seed: int = 0) -> dict[str, dict]:
    """Real JPEG and PNG files (sizes vary), some in nested folders; returns relpath → what it holds."""
    rng = np.random.default_rng(seed)
    expected = {}
    for label, name in enumerate(CLASSES):
        for index in range(per_class):
            height, width = size + int(rng.integers(0, 9)), size + int(rng.integers(0, 9))
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            png = index % 3 == 0
            data = (tf.io.encode_png(pixels) if png else tf.io.encode_jpeg(pixels, quality=90)).numpy()
            relpath = f"{name}/{'more/' if index % 4 == 1 else ''}{index}.{'png' if png else 'jpg'}"
            path = os.path.join(str(root), relpath)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
            expected[relpath] = {"bytes": data, "label": label, "height": height, "width": width}
    with open(os.path.join(str(root), CLASSES[0], "notes.txt"), "w") as handle:
        handle.write("not an image: ignored, as image_dataset_from_directory ignores it")
    return expected


def read_split(out, split: str) -> list[dict]:
    """Every example of a split, parsed with the spec from metadata.json (as `data.source.dir` does)."""
    metadata = read_metadata(str(out))
    files = [os.path.join(str(out), name) for name in metadata["splits"][split]["files"]]
    dataset = tf.data.TFRecordDataset(files, compression_type=metadata["compression"])
    return [{k: v.numpy() for k, v in example.items()} for example in dataset.map(make_parser(dir_features(str(out))))]


def test_image_folder_round_trip(tmp_path):
    expected = make_image_folder(tmp_path / "images")
    out = tmp_path / "out"
    source = ImageFolderSource(str(tmp_path / "images"), splits="train=0.75,validation=0.25", seed=3)
    result = convert(source, str(out), ConvertOptions(target_shard_mb=0.005, min_shards=2, **FAST))
    metadata = result.metadata
    assert metadata["class_names"] == list(CLASSES)
    assert metadata["source"]["kind"] == "image-folder" and metadata["source"]["num_files"] == 18
    assert {s: metadata["splits"][s]["num_examples"] for s in metadata["splits"]} == {"train": 14, "validation": 4}
    assert sorted(os.listdir(out)) == sorted(["metadata.json"] + [f for s in metadata["splits"].values() for f in s["files"]])
    seen = []
    for split in ("train", "validation"):
        examples = read_split(out, split)
        assert len(examples) == metadata["splits"][split]["num_examples"] == sum(metadata["splits"][split]["counts"])
        for example in examples:
            original = expected[example["filename"].decode()]
            assert example["image"] == original["bytes"]  # the original encoded bytes, not re-encoded
            assert example["label"] == original["label"]
            assert example["label_name"].decode() == CLASSES[original["label"]]
            assert (example["height"], example["width"]) == (original["height"], original["width"])
            seen.append(example["filename"].decode())
    assert sorted(seen) == sorted(expected)  # every image exactly once, over both splits
    # The same command again: the dataset is complete, nothing is rewritten.
    stamp = os.stat(out / metadata["splits"]["train"]["files"][0]).st_mtime_ns
    again = convert(source, str(out), ConvertOptions(target_shard_mb=0.005, min_shards=2, **FAST))
    assert again.already_complete and again.shards_written == 0
    assert os.stat(out / metadata["splits"]["train"]["files"][0]).st_mtime_ns == stamp


def test_reencode_png_keeps_the_pixels(tmp_path):
    expected = make_image_folder(tmp_path / "images", per_class=2)
    out = tmp_path / "out"
    convert(ImageFolderSource(str(tmp_path / "images"), reencode="png"), str(out), ConvertOptions(**FAST))
    for example in read_split(out, "train"):
        assert example["image"][:4] == b"\x89PNG"
        original = tf.io.decode_image(expected[example["filename"].decode()]["bytes"]).numpy()
        np.testing.assert_array_equal(tf.io.decode_png(example["image"]).numpy(), original)


def test_shard_counts_and_sizes(tmp_path):
    make_image_folder(tmp_path / "images", per_class=14, size=24)
    root = str(tmp_path / "images")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if not f.endswith(".txt"))
    target_mb = total / 5 / 2**20
    metadata = convert(ImageFolderSource(root), str(tmp_path / "a"), ConvertOptions(target_shard_mb=target_mb, min_shards=1, **FAST)).metadata
    split = metadata["splits"]["train"]
    assert len(split["files"]) in (5, 6)  # ceil(estimated size / target); the estimate adds per-record overhead
    assert split["files"][0] == f"train-00000-of-{len(split['files']):05d}.tfrecord"
    assert max(split["counts"]) - min(split["counts"]) <= 1
    sizes = [os.path.getsize(tmp_path / "a" / name) for name in split["files"]]
    assert sizes == split["bytes"]
    assert max(sizes) <= 1.5 * target_mb * 2**20 and sum(sizes) / len(sizes) <= 1.1 * target_mb * 2**20
    # --min_shards wins over a large target; never more shards than examples; compression names the files.
    metadata = convert(ImageFolderSource(root), str(tmp_path / "b"), ConvertOptions(min_shards=12, compression="GZIP", **FAST)).metadata
    assert len(metadata["splits"]["train"]["files"]) == 12
    assert metadata["splits"]["train"]["files"][0].endswith(".tfrecord.gz") and metadata["compression"] == "GZIP"
    assert len(read_split(tmp_path / "b", "train")) == 42
    metadata = convert(ImageFolderSource(root), str(tmp_path / "c"), ConvertOptions(min_shards=100, **FAST)).metadata
    assert metadata["splits"]["train"]["counts"] == [1] * 42


def test_corrupt_images_stop_the_conversion_or_are_skipped_and_listed(tmp_path):
    make_image_folder(tmp_path / "images", per_class=4)
    good = tf.io.encode_jpeg(np.zeros((16, 16, 3), np.uint8)).numpy()
    truncated = tmp_path / "images" / "dog" / "truncated.jpg"
    truncated.write_bytes(good[: len(good) // 2])
    garbage = tmp_path / "images" / "emu" / "garbage.png"
    garbage.write_bytes(b"this is not a PNG file at all")
    out = str(tmp_path / "out")
    source = ImageFolderSource(str(tmp_path / "images"))
    with pytest.raises(DataError) as error:
        convert(source, out, ConvertOptions(min_shards=1, **FAST))
    message = str(error.value)
    assert (str(truncated) in message or str(garbage) in message) and "--on_error=skip" in message
    assert read_metadata(out) is None
    metadata = convert(source, out, ConvertOptions(min_shards=1, on_error="skip", **FAST)).metadata
    split = metadata["splits"]["train"]
    assert split["num_examples"] == 12 and split["num_skipped"] == 2
    assert sorted(s["where"] for s in split["skipped"]) == sorted([str(truncated), str(garbage)])
    assert all(s["reason"].startswith("not a readable image") for s in split["skipped"])
    assert len(read_split(out, "train")) == 12


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)


def test_cli_reports_a_corrupt_image_in_one_line_then_skips_it(tmp_path):
    make_image_folder(tmp_path / "images", per_class=2)
    bad = tmp_path / "images" / "cat" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    base = ["--from", "image-folder", str(tmp_path / "images"), "--out", str(tmp_path / "out"), "--noprogress"]
    result = cli(*base)
    assert result.returncode == 2
    assert f"cannot convert {bad}: not a readable image" in result.stderr and "--on_error=skip" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli(*base, "--on_error=skip", "--splits=train=0.5,validation=0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipped 1 unreadable item(s)" in result.stdout and str(bad) in result.stdout
    assert "dir: " + str(tmp_path / "out") in result.stdout


def test_killed_conversion_leaves_nothing_complete_and_a_rerun_finishes(tmp_path):
    expected = make_image_folder(tmp_path / "images", per_class=8)
    out = tmp_path / "out"
    args = ["--from", "image-folder", str(tmp_path / "images"), "--out", str(out), "--target_shard_mb", "0.001",
            "--min_shards", "1", "--workers", "2"]
    kill_convert_after_shards(args, out, tmp_path / "killed.log")
    state = out / STATE_DIR
    assert not (out / "metadata.json").exists()
    assert not list(out.glob("*.tfrecord*")), "an interrupted conversion must not leave shards under final names"
    finished = len(list(state.glob("*.tfrecord.json")))
    assert 3 <= finished < 24
    with pytest.raises(DataError, match="did not finish"):
        Pipeline.from_config(config_from_dict({"data": {"source": {"type": "tfrecord", "dir": str(out)}, "batch_size": 8}}).data)

    result = cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = int(result.stdout.split("kept ")[1].split()[0])
    assert kept >= finished and f"wrote {24 - kept} shard(s)" in result.stdout
    assert not state.exists()
    metadata = read_metadata(str(out))
    assert metadata["splits"]["train"]["num_examples"] == 24 and len(metadata["splits"]["train"]["files"]) == 24
    examples = read_split(out, "train")
    assert sorted(e["filename"].decode() for e in examples) == sorted(expected)
    assert all(e["image"] == expected[e["filename"].decode()]["bytes"] for e in examples)


def write_csv(path, rows: list[list]) -> None:
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_csv_round_trip_with_numeric_and_string_columns(tmp_path):
    rows = [["id", "height", "city", "label"]]
    rows += [[i, 1.5 * i + 0.25, f"town {i}, \"quoted\"\nsecond line" if i % 5 == 0 else f"town{i}", ["lo", "mid", "hi"][i % 3]]
             for i in range(30)]
    write_csv(tmp_path / "data.csv", rows)
    source = CsvSource(str(tmp_path / "data.csv"), splits="train=0.8,validation=0.2")
    assert source.dtypes == {"id": "int64", "height": "float32", "city": "string", "label": "string"}
    metadata = convert(source, str(tmp_path / "out"), ConvertOptions(min_shards=3, **FAST)).metadata
    assert metadata["class_names"] == ["hi", "lo", "mid"]
    assert metadata["features"]["label"] == {"dtype": "int64"} and metadata["features"]["label_name"] == {"dtype": "string"}
    examples = read_split(tmp_path / "out", "train") + read_split(tmp_path / "out", "validation")
    assert sorted(int(e["id"]) for e in examples) == list(range(30))
    for example in examples:
        i = int(example["id"])
        assert example["height"] == pytest.approx(1.5 * i + 0.25)
        assert example["city"].decode() == rows[i + 1][2]
        assert metadata["class_names"][example["label"]] == example["label_name"].decode() == rows[i + 1][3]


def test_csv_bad_rows_are_reported_by_line_number_or_skipped(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("x,y\n1,2.5\n2,3.5\n3\n4,oops\n5,6\n")
    source = CsvSource(str(path), columns={"x": "int64", "y": "float32"})
    with pytest.raises(DataError, match=r"line (4|5)"):
        convert(source, str(tmp_path / "a"), ConvertOptions(min_shards=1, **FAST))
    metadata = convert(source, str(tmp_path / "b"), ConvertOptions(min_shards=1, on_error="skip", **FAST)).metadata
    skipped = sorted(s["where"] for s in metadata["splits"]["train"]["skipped"])
    assert skipped == [f"{path}, line 4", f"{path}, line 5"]
    assert sorted(int(e["x"]) for e in read_split(tmp_path / "b", "train")) == [1, 2, 5]


def test_numpy_round_trip_with_images_reencoded(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "image": rng.integers(0, 256, size=(20, 8, 8, 3), dtype=np.uint8),
        "x": rng.normal(size=(20, 3)).astype(np.float64),
        "label": np.array(["yes", "no"] * 10),
        "id": np.arange(20),
    }
    np.savez(tmp_path / "arrays.npz", **arrays)
    metadata = convert(NumpySource(str(tmp_path / "arrays.npz"), reencode="png"), str(tmp_path / "out"),
                       ConvertOptions(min_shards=4, **FAST)).metadata
    assert metadata["features"]["x"] == {"dtype": "float32", "shape": [3]}
    assert metadata["class_names"] == ["no", "yes"] and len(metadata["splits"]["train"]["files"]) == 4
    examples = read_split(tmp_path / "out", "train")
    assert sorted(int(e["id"]) for e in examples) == list(range(20))
    for example in examples:
        i = int(example["id"])
        np.testing.assert_array_equal(tf.io.decode_png(example["image"]).numpy(), arrays["image"][i])
        np.testing.assert_allclose(example["x"], arrays["x"][i].astype(np.float32))
        assert example["label_name"].decode() == arrays["label"][i]


def test_a_config_points_at_the_directory(tmp_path):
    make_image_folder(tmp_path / "images", per_class=8)
    out = str(tmp_path / "out")
    convert(ImageFolderSource(str(tmp_path / "images"), splits="train=0.75,validation=0.25"), out,
            ConvertOptions(min_shards=4, **FAST))
    data = {
        "source": {"type": "tfrecord", "dir": out, "split": "train", "deterministic": True},
        "preprocess": [{"op": "decode_image"}, {"op": "resize", "size": 16}],
        "shuffle": {"enabled": False}, "batch_size": 6, "drop_remainder": False,
        "outputs": {"inputs": "image", "targets": "label"},
    }
    config = config_from_dict({"data": data}).data
    info = source_from_config(config).info()
    assert (info.num_examples, info.class_names, info.num_classes) == (18, list(CLASSES), 3)
    assert set(info.features) == {"image", "label", "label_name", "height", "width", "filename"}
    dataset = Pipeline.from_config(config).build()
    assert int(dataset.cardinality()) == 3  # exact: from metadata.json
    assert sum(int(y.shape[0]) for _, y in dataset) == 18
    # Two input pipelines: each reads its own 2 of the 4 shards, together every example once.
    data["source"]["split"] = "validation"
    data["outputs"] = None
    data["preprocess"] = []
    config = config_from_dict({"data": data}).data
    names = []
    for pipeline_id in range(2):
        dataset = Pipeline.from_config(config).build(tf.distribute.InputContext(2, pipeline_id, 2))
        names.append([n for batch in dataset for n in batch["filename"].numpy().tolist()])
    assert not set(names[0]) & set(names[1]) and len(names[0]) + len(names[1]) == 6


def test_config_errors_for_dir_sources(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of files"):
        config_from_dict({"data": {"source": {"type": "tfrecord", "dir": "x", "files": "y"}, "batch_size": 8}})
    with pytest.raises(ConfigError, match="data.source.split: only with"):
        config_from_dict({"data": {"source": {"type": "tfrecord", "files": "y", "split": "train"},
                                   "features": {"a": {"dtype": "int64"}}, "batch_size": 8}})
    with pytest.raises(ConfigError, match="needs a feature spec"):
        config_from_dict({"data": {"source": {"type": "tfrecord", "files": "y"}, "batch_size": 8}})
    missing = config_from_dict({"data": {"source": {"type": "tfrecord", "dir": str(tmp_path / "nope")}, "batch_size": 8}}).data
    with pytest.raises(DataError, match="does not exist"):
        source_from_config(missing).info()
    make_image_folder(tmp_path / "images", per_class=1)
    convert(ImageFolderSource(str(tmp_path / "images")), str(tmp_path / "out"), ConvertOptions(**FAST))
    wrong_split = config_from_dict({"data": {"source": {"type": "tfrecord", "dir": str(tmp_path / "out"), "split": "test"},
                                             "batch_size": 8}}).data
    with pytest.raises(DataError, match=r"no split 'test'; its splits: \['train'\]"):
        Pipeline.from_config(wrong_split).build()


def test_existing_output_is_protected(tmp_path):
    make_image_folder(tmp_path / "images", per_class=2)
    out = str(tmp_path / "out")
    convert(ImageFolderSource(str(tmp_path / "images")), out, ConvertOptions(**FAST))
    other = ImageFolderSource(str(tmp_path / "images"), seed=7)
    with pytest.raises(DataError, match="already holds a finished dataset.*--overwrite"):
        convert(other, out, ConvertOptions(**FAST))
    result = convert(other, out, ConvertOptions(overwrite=True, min_shards=2, **FAST))
    assert result.metadata["source"]["seed"] == 7
    assert sorted(os.listdir(out)) == ["metadata.json", "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match="already holds TFRecord shards"):
        convert(other, str(stray), ConvertOptions(**FAST))


def test_split_flag_errors(tmp_path):
    assert split_fractions("train") == {"train": 1.0}
    assert split_fractions("train=0.9, validation=0.1") == {"train": 0.9, "validation": 0.1}
    with pytest.raises(ConfigError, match="add up to 0.95"):
        split_fractions("train=0.9,validation=0.05")
    with pytest.raises(ConfigError, match="letters, digits"):
        split_fractions("train-a")
    with pytest.raises(DataError, match="sub-folder"):
        (tmp_path / "flat.jpg").write_bytes(b"")
        ImageFolderSource(str(tmp_path))


def test_convert_command_from_csv_with_flags(tmp_path):
    write_csv(tmp_path / "flowers.csv", [["petal", "kind"]] + [[i * 0.5, i % 2] for i in range(12)])
    out = tmp_path / "out"
    result = cli("--from", "csv", str(tmp_path / "flowers.csv"), "--out", str(out), "--label_column", "kind",
                 "--class_names", "iris,rose", "--columns", "petal:float32", "--min_shards", "3", "--noprogress")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 12 examples in 3 shard(s)" in result.stdout and "classes (2): iris, rose" in result.stdout
    examples = read_split(out, "train")
    assert sorted((float(e["petal"]), int(e["kind"])) for e in examples) == [(i * 0.5, i % 2) for i in range(12)]
    result = cli("--from", "csv", str(tmp_path / "flowers.csv"), "--out", str(out), "--label_column", "species")
    assert result.returncode == 2 and "--label_column: no column 'species'" in result.stderr


def test_a_failed_move_into_place_leaves_no_metadata_json_and_a_rerun_finishes(tmp_path, monkeypatch):
    """metadata.json is the mark of a finished dataset: if moving any shard into place fails, it must
    not exist (a reader would take a dataset with a missing shard for a whole one)."""
    write_csv(tmp_path / "data.csv", [["x", "y"]] + [[i, i * 0.5] for i in range(30)])
    source = CsvSource(str(tmp_path / "data.csv"))
    out = str(tmp_path / "out")
    failing = os.path.join(out, "train-00001-of-00003.tfrecord")
    real_rename = tf.io.gfile.rename

    def rename(src: str, dst: str, overwrite: bool = False) -> None:
        if os.path.abspath(dst) == failing:  # only the move of shard 1 into place fails: a full disk, a lost mount
            raise tf.errors.PermissionDeniedError(None, None, f"{dst}: Permission denied")
        real_rename(src, dst, overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    with pytest.raises(tf.errors.PermissionDeniedError, match="train-00001-of-00003.tfrecord: Permission denied"):
        convert(source, out, ConvertOptions(min_shards=3, **FAST))
    assert not os.path.exists(os.path.join(out, "metadata.json")), "a dataset missing a shard looks finished"
    assert read_metadata(out) is None
    assert not os.path.exists(failing)
    with pytest.raises(DataError, match="did not finish"):
        Pipeline.from_config(config_from_dict({"data": {"source": {"type": "tfrecord", "dir": out}, "batch_size": 8}}).data)

    monkeypatch.setattr(tf.io.gfile, "rename", real_rename)
    result = convert(source, out, ConvertOptions(min_shards=3, **FAST))
    assert result.shards_written == 0 and result.shards_reused == 3  # every shard was whole: only the moves remained
    assert sorted(os.listdir(out)) == ["metadata.json"] + [f"train-0000{k}-of-00003.tfrecord" for k in range(3)]
    assert sorted(int(e["x"]) for e in read_split(out, "train")) == list(range(30))
