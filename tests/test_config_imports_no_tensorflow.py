"""Loading a config imports no TensorFlow (docs/architecture.md): a notebook or a CLI can read and
check a config in a fraction of a second, before TF starts. Checked in a fresh process, where nothing
else has imported TensorFlow yet."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HEAVY_MODULES = ("tensorflow", "keras", "tf_keras", "tensorflow_datasets")

LOAD_EVERY_CONFIG = """
import glob, os, sys
import tpu_pipeline
import tpu_pipeline.config
from tpu_pipeline import ConfigError, load_config
from tpu_pipeline.config import config_from_dict

paths = sorted(glob.glob('configs/*.yaml')) + ['tpu_pipeline/configs_builtin/demo.yaml']
assert len(paths) > 1, paths
for path in paths:
    config = load_config(path, ['data.batch_size=16', 'data.seed=7'])
    assert config.data.batch_size == 16 and config.data.seed == 7, path
    try:
        load_config(path, ['data.batch_size=-1'])
    except ConfigError as error:
        assert 'data.batch_size' in str(error), error
    else:
        raise AssertionError(path + ': data.batch_size=-1 was accepted')
config_from_dict({'data': {'source': {'type': 'tfds', 'name': 'mnist'}, 'batch_size': 8}})
try:
    load_config(os.path.join('configs', 'no_such_config.yaml'))
except ConfigError:
    pass
else:
    raise AssertionError('a missing config file was accepted')
print(sorted({m.split('.')[0] for m in sys.modules} & {heavy}))
"""


def test_loading_every_config_imports_no_tensorflow():
    code = LOAD_EVERY_CONFIG.replace("{heavy}", repr(set(HEAVY_MODULES)))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", f"loading a config imported {result.stdout.strip()}"


def test_a_url_is_still_read_through_tf_io_gfile():
    """Only a path with `://` goes to tf.io.gfile (gs://...); file:// shows it here without a bucket
    (plain Python's open would not find a `file://` path at all)."""
    from tpu_pipeline.config import load_config
    from tpu_pipeline.config.loader import params_override

    local = os.path.join(REPO, "configs", "demo.yaml")
    assert load_config("file://" + local, ["data.seed=5"]) == load_config(local, ["data.seed=5"])
    assert params_override("file://" + local) == params_override(local)
