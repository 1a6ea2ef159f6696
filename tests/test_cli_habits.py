"""Command-line habits users bring: layered --config files, --params_override, `--epochs 3`,
paths relative to the config file, `tpu-pipeline config` and `tpu-pipeline devices`."""
from __future__ import annotations

import textwrap

import pytest
import yaml
from cli_children import command, demo_data, environment, help_runs, in_process, together
from jax_child import requires_jax

from tpu_pipeline.config import load_config
from tpu_pipeline.config.loader import params_override, suggest_config_key

pytestmark = pytest.mark.tf_independent


def test_layered_files_later_wins_and_relative_input_paths_follow_their_file(tmp_path):
    (tmp_path / "project" / "data").mkdir(parents=True)
    (tmp_path / "project" / "base.yaml").write_text(textwrap.dedent("""
        data:
          source: {type: tfrecord, files: "data/train-*.tfrecord"}
          features: {x: {dtype: int64}}
          batch_size: 32
          cache: {path: cache/}
        train: {epochs: 5, run_dir: runs/a}
    """))
    (tmp_path / "site.yaml").write_text("data: {batch_size: 64}\ntrain: {epochs: 7}\n")
    config = load_config([str(tmp_path / "project" / "base.yaml"), str(tmp_path / "site.yaml")], ["train.epochs=9"])
    assert config.data.batch_size == 64 and config.train.epochs == 9
    assert config.data.source.files == str(tmp_path / "project" / "data" / "train-*.tfrecord")
    assert config.data.cache.path == str(tmp_path / "project" / "cache")
    assert config.train.run_dir == "runs/a"  # an output: relative to where you run


def test_params_override_takes_yaml_text_or_a_file(tmp_path):
    assert params_override("train: {epochs: 3}") == {"train": {"epochs": 3}}
    (tmp_path / "o.yaml").write_text("data: {batch_size: 8}\n")
    assert params_override(str(tmp_path / "o.yaml")) == {"data": {"batch_size": 8}}


def test_an_unknown_flag_suggests_the_config_key(demo_cache, capsys, monkeypatch):
    assert suggest_config_key("--epochs", "3") == "train.epochs=3"
    # the entry point in this process: the words and the exit code (a user error from a real process, one
    # line on stderr and exit 2: test_cli.py's warm-up test)
    code, _, stderr = in_process(capsys, monkeypatch, demo_cache, "train", "--epochs", "3")
    assert code == 2
    assert stderr.strip().splitlines()[-1] == (
        "tpu-pipeline train: error: unknown flag --epochs; config keys are key=value arguments: train.epochs=3")


def test_config_prints_the_resolved_config_which_loads_back(tmp_path, demo_cache, capsys, monkeypatch):
    # the entry point in this process (tests/cli_children.py): what the command prints; that a real process's
    # stdout holds only that is test_devices_says_what_the_resolver_found's (its exact first lines)
    code, stdout, stderr = in_process(capsys, monkeypatch, demo_cache, "config", "--params_override",
                                      "train: {epochs: 4}", "data.batch_size=64")
    assert code == 0, stderr[-2000:]
    printed = yaml.safe_load(stdout)
    assert printed["train"]["epochs"] == 4 and printed["data"]["batch_size"] == 64
    assert printed["data"]["shuffle"]["buffer_size"] == 4096 and "on_error" in printed["data"]  # defaults filled in
    code, set_only, _ = in_process(capsys, monkeypatch, demo_cache, "config", "--set_only", "--params_override",
                                   "train: {epochs: 4}")
    assert code == 0
    (tmp_path / "resolved.yaml").write_text(set_only)
    assert load_config(str(tmp_path / "resolved.yaml")).train.epochs == 4


def test_devices_says_what_the_resolver_found(tmp_path, demo_cache):
    (result,) = together([(command("devices", "cluster.cpu_replicas=2"), environment(demo_cache))], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tensorflow: ") and lines[1].startswith("libtpu: ")  # the build, then libtpu
    assert lines[2].startswith("framework: tensorflow (tf.distribute;")
    assert lines[3:7] == ["kind: cpu", "replicas: 2 on 1 host(s)", "strategy: MirroredStrategy",
                         "found from: cluster.cpu_replicas"]
    assert sum(line.strip().endswith(("device:CPU:0", "device:CPU:1")) for line in lines) == 2


def test_a_missing_dataset_directory_says_how_to_create_it(tmp_path):
    import pytest

    from tpu_pipeline.errors import DataError
    from tpu_pipeline.pipeline import Pipeline

    def build(directory: str) -> None:
        config = load_config(base={"data": {"source": {"type": "tfrecord", "dir": directory}, "batch_size": 4}})
        Pipeline.from_config(config.data)

    with pytest.raises(DataError, match=r"does not exist; create it with `tpu-pipeline convert --from text\|chat\|parquet\|hf\|image-folder\|csv"):
        build(str(tmp_path / "flowers"))
    with pytest.raises(DataError, match=r"built-in demo data, which `tpu-pipeline demo` .* writes on first use"):
        build(str(tmp_path / "demo_shapes" / "v1"))


def test_text_or_parquet_files_given_as_tfrecords_are_named_with_their_convert_command(tmp_path):
    """Issue 47 item 4: a folder or glob of text files where TFRecords are expected got "its conversion did not
    finish ... run the same convert command again", or "the record length fails its CRC ... convert the file
    again". Each reader now names what the files are and the convert command that makes TFRecords of them."""
    from tpu_pipeline.errors import DataError
    from tpu_pipeline.format.metadata import read_dataset_metadata
    from tpu_pipeline.format.sniff import bytes_kind
    from tpu_pipeline.pipeline.checks.record_check import FileChecker
    from tpu_pipeline.pipeline.checks.spec_check import first_record

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index, text in enumerate(["Licence text.\n\tIndented, «UTF-8» too.\r\n", "Another file\n"]):
        (corpus / f"doc{index}.txt").write_text(text, encoding="utf-8")
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "part-0.parquet").write_bytes(b"PAR1" + bytes(64))

    hint = r"these are text files, not TFRecords: convert them with `tpu-pipeline convert --from text "
    with pytest.raises(DataError, match=rf"data.source.dir: .*: {hint}.*corpus/\*\.txt --out .*corpus_converted`"):
        read_dataset_metadata(str(corpus))
    with pytest.raises(DataError, match=r"these are Parquet files, not TFRecords: .* --from parquet .*tables/\*\.parquet"):
        read_dataset_metadata(str(tables))
    with pytest.raises(DataError, match=rf"doc0.txt: {hint}.*corpus/\*\.txt --out DIR`"):
        first_record(str(corpus / "doc0.txt"))
    # verify's record check: the framing fault stays what it is, the fix is the conversion.
    config = load_config(base={"data": {"source": {"type": "tfrecord", "files": str(corpus / "*.txt")},
                                        "features": {"tokens": {"dtype": "int64", "kind": "ragged"}}, "batch_size": 4}})
    checker = FileChecker(config.data, "data", dict(config.data.features), None)
    _, faults = checker.check_file(str(corpus / "doc0.txt"), "", None)
    assert [(fault.record, fault.kind) for fault in faults] == [(0, "bad_length_crc")], faults
    assert faults[0].fix.startswith(hint.replace("\\", "")), faults[0].fix

    # What is not text stays unknown: a TFRecord's zero bytes, a cut multi-byte character only at the end.
    assert bytes_kind(b"\x0c\x00\x00\x00\x00\x00\x00\x00abcd") is None
    assert bytes_kind("ab«".encode()[:-1]) == "text" and bytes_kind(b"\xff\xfeab" * 8) is None


def test_help_lists_the_project_flags_before_absl_and_tensorflow(demo_cache):
    short, full = help_runs(demo_cache)  # `train --help`, `doctor --helpfull` (shared with test_cli.py)
    assert short.returncode == 0 and "--config" in short.stdout and "--params_override" in short.stdout
    assert "absl.app" not in short.stdout and len(short.stdout.splitlines()) < 40
    full = full.stdout.split("flags:\n", 1)[1]
    assert full.index("--write-tuned") < full.index("--config:") < full.index("absl.app")


@requires_jax
def test_devices_on_jax_names_the_framework_and_counts_its_devices(tmp_path, demo_cache):
    demo_data(demo_cache)  # both children would write it (not atomically); they run together
    result, refused = together([
        (command("devices", "model.framework=jax", "cluster.cpu_replicas=4"), environment(demo_cache)),
        (command("devices", "model.framework=tensorflow"), environment(demo_cache, KERAS_BACKEND="jax")),
    ], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[2].startswith("framework: jax ") and "on cpu: 4 device(s) in 1 process(es)" in lines[2], lines[2]
    assert lines[3:7] == ["kind: cpu", "replicas: 4 on 1 host(s)", "strategy: JaxDataParallel",
                          "found from: one JAX process"]
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "model.framework is tensorflow but KERAS_BACKEND=jax; make them agree: unset KERAS_BACKEND, or set it to "
        "tensorflow, or change model.framework"), refused.stderr[-2000:]


def test_training_names_data_repeat_only_to_a_user_who_set_it(caplog):
    """Issue 47 item 7: "data.repeat=1: training repeats the data forever" was logged on configs/image_folder.yaml,
    which sets no repeat (its default, 1, is for evaluation and bench)."""
    import logging

    from tpu_pipeline.train.runner import _training_data

    caplog.set_level(logging.INFO)
    unset = load_config("configs/image_folder.yaml", ["data.source.dir=/nowhere"])
    assert "repeat" not in unset.data.model_fields_set and _training_data(unset).repeat == "forever"
    assert "data.repeat" not in caplog.text
    set_ = load_config("configs/image_folder.yaml", ["data.source.dir=/nowhere", "data.repeat=2"])
    assert _training_data(set_).repeat == "forever"
    assert "data.repeat=2: training repeats the data forever" in caplog.text


def test_the_demo_data_says_where_it_was_written_once(tmp_path, caplog):
    """Issue 47 item 7: the demo data was written without saying where. The first run says it, later ones
    reuse it quietly."""
    import logging

    from tpu_pipeline.records import ensure_demo_dataset

    caplog.set_level(logging.INFO)
    out_dir = ensure_demo_dataset(str(tmp_path), num_train=8, num_eval=4, size=32, num_shards=1)
    assert f"wrote the built-in demo data (8 training and 4 validation 32x32 images) to {out_dir}" in caplog.text
    caplog.clear()
    assert ensure_demo_dataset(str(tmp_path), num_train=8, num_eval=4, size=32, num_shards=1) == out_dir
    assert "wrote" not in caplog.text


def test_matplotlibs_font_cache_notice_is_not_shown_but_its_other_warnings_are():
    """Issue 47 item 7: a JAX run printed "Matplotlib is building the font cache" (Keras 3's import pulls
    matplotlib in). The CLI's filter drops that notice, as it drops TensorFlow's INFO lines; every other
    warning stays."""
    import logging

    from tpu_pipeline.cli import _OthersInfoFilter

    def record(path: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("matplotlib.font_manager", level, path, 1, message, None, None)

    shown = _OthersInfoFilter().filter
    font_manager = "/venv/lib/python3.11/site-packages/matplotlib/font_manager.py"
    assert not shown(record(font_manager, logging.WARNING, "Matplotlib is building the font cache; this may take a moment."))
    assert shown(record(font_manager, logging.WARNING, "findfont: Font family 'Foo' not found."))
    assert not shown(record("/venv/lib/python3.11/site-packages/tensorflow/x.py", logging.INFO, "Sharding callback duration"))
    assert shown(record("/work/tpu_pipeline/train/runner.py", logging.INFO, "model transformer: 1 parameters"))


def test_the_command_runs_with_fewer_garbage_collections_before_tensorflow_starts():
    """Issue 46: with CPython's thresholds a short `train` spent a sixth of its CPU in ~1,000 collections of the
    objects TensorFlow's import and tracing leave for the whole process. The CLI raises them on import, before
    TensorFlow's (a fresh interpreter: `-c` programs are not forked from the suite's servers)."""
    import subprocess
    import sys

    from tpu_pipeline.system import COLLECTION_THRESHOLDS

    program = "import gc, sys, tpu_pipeline.cli; print(gc.get_threshold(), 'tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [*str(COLLECTION_THRESHOLDS).split(), "False"], result.stdout


def test_the_missing_data_line_names_every_source_convert_takes():
    """A data.source.dir that does not exist is answered with the `convert --from` to run; its list of inputs
    left out `chat` when chat conversion came. It is kept beside the flag's own choices here."""
    from tpu_pipeline.commands.convert import SOURCES
    from tpu_pipeline.format.metadata import CONVERT_SOURCES

    assert sorted(CONVERT_SOURCES.split("|")) == sorted(SOURCES)


def test_our_own_warnings_read_as_plain_lines_and_others_keep_where_they_came_from():
    """`convert` warned in absl's glog form (`W1130 17:18:07.598663 140367850367872 convert.py:211] Split 'train'
    has only 3 examples...`), which a user reads as TensorFlow's noise; ours now read `warning: ...`."""
    import logging

    from tpu_pipeline.cli import _PlainOwnLines

    def record(path: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("absl", level, path, 211, message, None, None)

    glog = logging.Formatter("%(levelname).1s glog %(filename)s:%(lineno)d] %(message)s")
    plain = _PlainOwnLines(glog).format
    ours = "/work/tpu_pipeline/records/convert.py"
    assert plain(record(ours, logging.WARNING, "Split 'train' has only 3 examples")) == \
        "warning: Split 'train' has only 3 examples"
    assert plain(record(ours, logging.INFO, "wrote 3 shard(s)")) == "wrote 3 shard(s)"
    assert plain(record(ours, logging.ERROR, "x")) == "E glog convert.py:211] x"
    assert plain(record("/venv/site-packages/tensorflow/x.py", logging.WARNING, "y")) == "W glog x.py:211] y"
