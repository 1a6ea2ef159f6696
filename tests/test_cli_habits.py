"""Command-line habits users bring: layered --config files, --params_override, `--epochs 3`,
paths relative to the config file, `tpu-pipeline config` and `tpu-pipeline devices`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from jax_child import requires_jax

from tpu_pipeline.config import load_config
from tpu_pipeline.config.loader import params_override, suggest_config_key

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str, cwd: str, cache_dir: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TPU_PIPELINE_CACHE": cache_dir, "PYTHONPATH": REPO, **(env or {})}
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


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


def test_an_unknown_flag_suggests_the_config_key(tmp_path, demo_cache):
    assert suggest_config_key("--epochs", "3") == "train.epochs=3"
    result = cli("train", "--epochs", "3", cwd=str(tmp_path), cache_dir=demo_cache)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "tpu-pipeline train: error: unknown flag --epochs; config keys are key=value arguments: train.epochs=3")


def test_config_prints_the_resolved_config_which_loads_back(tmp_path, demo_cache):
    result = cli("config", "--params_override", "train: {epochs: 4}", "data.batch_size=64",
                 cwd=str(tmp_path), cache_dir=demo_cache)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["train"]["epochs"] == 4 and printed["data"]["batch_size"] == 64
    assert printed["data"]["shuffle"]["buffer_size"] == 4096 and "on_error" in printed["data"]  # defaults filled in
    set_only = cli("config", "--set_only", "--params_override", "train: {epochs: 4}", cwd=str(tmp_path),
                   cache_dir=demo_cache)
    (tmp_path / "resolved.yaml").write_text(set_only.stdout)
    assert load_config(str(tmp_path / "resolved.yaml")).train.epochs == 4


def test_devices_says_what_the_resolver_found(tmp_path, demo_cache):
    result = cli("devices", "cluster.cpu_replicas=2", cwd=str(tmp_path), cache_dir=demo_cache)
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

    with pytest.raises(DataError, match=r"does not exist; create it with `tpu-pipeline convert --from image-folder\|csv"):
        build(str(tmp_path / "flowers"))
    with pytest.raises(DataError, match=r"built-in demo data, which `tpu-pipeline demo` .* writes on first use"):
        build(str(tmp_path / "demo_shapes" / "v1"))


def test_help_lists_the_project_flags_before_absl_and_tensorflow(tmp_path, demo_cache):
    short = cli("train", "--help", cwd=str(tmp_path), cache_dir=demo_cache)
    assert short.returncode == 0 and "--config" in short.stdout and "--params_override" in short.stdout
    assert "absl.app" not in short.stdout and len(short.stdout.splitlines()) < 40
    full = cli("doctor", "--helpfull", cwd=str(tmp_path), cache_dir=demo_cache).stdout.split("flags:\n", 1)[1]
    assert full.index("--write-tuned") < full.index("--config:") < full.index("absl.app")


@requires_jax
def test_devices_on_jax_names_the_framework_and_counts_its_devices(tmp_path, demo_cache):
    result = cli("devices", "model.framework=jax", "cluster.cpu_replicas=4", cwd=str(tmp_path), cache_dir=demo_cache)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[2].startswith("framework: jax ") and "on cpu: 4 device(s) in 1 process(es)" in lines[2], lines[2]
    assert lines[3:7] == ["kind: cpu", "replicas: 4 on 1 host(s)", "strategy: JaxDataParallel",
                          "found from: one JAX process"]
    refused = cli("devices", "model.framework=tensorflow", cwd=str(tmp_path), cache_dir=demo_cache,
                  env={"KERAS_BACKEND": "jax"})
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "model.framework is tensorflow but KERAS_BACKEND=jax; make them agree: unset KERAS_BACKEND, or set it to "
        "tensorflow, or change model.framework"), refused.stderr[-2000:]
