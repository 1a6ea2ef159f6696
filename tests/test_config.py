"""Config validation: each error names the dotted key and what is allowed."""
from __future__ import annotations

import textwrap

import pytest

from tpu_pipeline.config import apply_overrides, config_from_dict, load_config
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import build_ops, check_ops, scoped_ops

from helpers import data_config

pytestmark = pytest.mark.tf_independent


def check_error(raw: dict, *fragments: str) -> str:
    with pytest.raises(ConfigError) as error:
        config_from_dict(raw)
    for fragment in fragments:
        assert fragment in str(error.value)
    return str(error.value)


def check_op_error(raw: dict, *fragments: str, section: str = "data") -> str:
    """Op errors: the config validates (it knows no ops); check_ops, as the commands run it, refuses it."""
    config = config_from_dict(raw)
    with pytest.raises(ConfigError) as error:
        check_ops(getattr(config, section), section)
    for fragment in fragments:
        assert fragment in str(error.value)
    return str(error.value)


def test_unknown_key_names_the_key_and_the_allowed_ones():
    raw = {"data": data_config("x*")}
    raw["data"]["shuffle"] = {"buffer_size": 10, "sead": 1}
    check_error(raw, "data.shuffle.sead: unknown key", "allowed keys here: buffer_size, enabled, mode, reshuffle_each_iteration")


def test_unknown_key_inside_the_source_union():
    raw = {"data": data_config("x*")}
    raw["data"]["source"]["cycle_lenght"] = 4
    check_error(raw, "data.source.cycle_lenght: unknown key", "cycle_length")


def test_unknown_section():
    check_error({"dta": {}}, "unknown config section(s) dta", "data")


def test_wrong_type_and_negative_values():
    raw = {"data": data_config("x*", batch_size="many")}
    raw["data"]["shuffle"] = {"buffer_size": -5}
    check_error(raw, "data.batch_size='many': must be a positive integer",
                "data.shuffle.buffer_size=-5: must be a positive integer")


def test_cache_after_a_random_op_is_refused():
    raw = {"data": data_config("x*", cache={"enabled": True})}
    raw["data"]["preprocess"].insert(1, {"op": "random_flip"})
    check_op_error(raw, "data.preprocess[1]", "random_flip", "data.augment", "data.cache.enabled=false")
    check_op_error({"eval_data": raw["data"]}, "eval_data.preprocess[1]", "eval_data.cache.enabled=false",
                   section="eval_data")


def test_unknown_op_and_bad_op_arguments():
    raw = {"data": data_config("x*", preprocess=[{"op": "resize_me"}])}
    check_op_error(raw, "data.preprocess[0]", "unknown preprocessing op 'resize_me'", "resize")
    raw = {"data": data_config("x*", augment=[{"op": "resize", "sise": 3}])}
    check_op_error(raw, "data.augment[0]", "op 'resize'", "size, method='bilinear', antialias=False, key='image'")


def test_bad_op_argument_values_are_named_when_the_pipeline_is_built():
    """Values are the factory's to check: it runs when the pipeline is built (build_ops), not at load."""
    raw = {"data": data_config("x*", preprocess=[{"op": "cast", "dtype": "float99"}])}
    config = config_from_dict(raw)
    check_ops(config.data)
    with pytest.raises(ConfigError) as error:
        build_ops(config.data.preprocess, "data.preprocess")
    assert "data.preprocess[0]" in str(error.value) and "float99" in str(error.value)


def test_feature_spec_rules_stay_in_the_config():
    raw = {"data": data_config("x*")}
    del raw["data"]["features"]
    check_error(raw, "data.features: a tfrecord source needs a feature spec")
    raw = {"eval_data": data_config("x*", source={"type": "tfds", "name": "mnist"})}
    check_error(raw, "eval_data.features: a tfds source yields decoded features", "eval_data.source.features")


@pytest.fixture
def parsed_flags():
    """absl flags as a command sees them (the --config flag of the CLI), reset afterwards."""
    from absl import flags

    import tpu_pipeline.cli  # noqa: F401  (defines --config)

    was_parsed = flags.FLAGS.is_parsed()
    if not was_parsed:
        flags.FLAGS.mark_as_parsed()
    yield flags.FLAGS
    if not was_parsed:
        flags.FLAGS.unparse_flags()


def test_commands_check_the_ops_when_they_load_a_config(tmp_path, parsed_flags):
    from absl.testing import flagsaver

    from tpu_pipeline.commands._common import load_raw

    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent('''
        data:
          source: {type: tfrecord, files: "x*"}
          features: {image: {dtype: string}}
          preprocess: [decode_image, {op: resize, size: 8}]
          batch_size: 8
        eval_data:
          source: {type: tfrecord, files: "y*"}
          features: {image: {dtype: string}}
          preprocess: [decode_image, {op: resize, size: 8}]
          batch_size: 8
    '''))
    with flagsaver.flagsaver(config=str(path)):
        raw, config = load_raw(["data.batch_size=16"])
        assert config.data.batch_size == 16 and raw["data"]["batch_size"] == 16
        with pytest.raises(ConfigError, match=r"^data.preprocess\[1\]: unknown preprocessing op 'resize_me'"):
            load_raw(["data.preprocess.1.op=resize_me"])
        with pytest.raises(ConfigError, match=r"^eval_data.preprocess\[1\]: bad arguments for op 'resize'"):
            load_raw(["eval_data.preprocess.1.sise=3"])
        with pytest.raises(ConfigError, match=r"^data.augment\[0\]: bad arguments for op 'random_flip'"):
            load_raw(["data.augment=[{op: random_flip, direction: vertical, axis: 1}]"])


def test_eval_section_reports_its_own_prefix():
    raw = {"eval_data": data_config("x*", prefetch=-1)}
    check_error(raw, "eval_data.prefetch")


def test_options_enum_values():
    raw = {"data": data_config("x*", options={"auto_shard_policy": "sometimes"})}
    check_error(raw, "data.options.auto_shard_policy", "'auto'", "'off'")


def test_overrides_reach_any_key_including_list_items():
    raw = {"data": data_config("x*")}
    result = apply_overrides(raw, ["data.batch_size=256", "data.preprocess.1.size=[32, 48]", "data.options.slack=true", "data.options.cpu_budget=null"])
    config = config_from_dict(result)
    assert config.data.batch_size == 256
    assert config.data.preprocess[1].args == {"size": [32, 48]}
    assert config.data.options.slack is True and config.data.options.cpu_budget is None
    assert raw["data"]["batch_size"] == 32, "overrides must not mutate the input"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("data.batch_size", "must look like key=value"),
        ("data.batch_size.x=3", "'data.batch_size' is a value, not a section"),
        ("data.preprocess.9.size=3", "list index below 5"),
        ("data.bogus=3", "data.bogus: unknown key"),
    ],
)
def test_bad_overrides_are_named(override, fragment):
    with pytest.raises(ConfigError) as error:
        config_from_dict(apply_overrides({"data": data_config("x*")}, [override]))
    assert fragment in str(error.value)
    assert "data." in str(error.value)


@pytest.fixture
def user_ops_module(tmp_path, monkeypatch):
    """A user module `my_ops` on sys.path; what it registers is gone after the test."""
    import sys

    (tmp_path / "my_ops.py").write_text(textwrap.dedent('''
        import tensorflow as tf
        from tpu_pipeline import register_op

        @register_op("invert_test_op")
        def invert(key="image"):
            def fn(features, seed=None):
                return {**features, key: 255.0 - tf.cast(features[key], tf.float32)}
            return fn
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_ops", raising=False)
    with scoped_ops():
        yield tmp_path
    sys.modules.pop("my_ops", None)


def test_yaml_file_with_imports_registers_user_ops(user_ops_module):
    tmp_path = user_ops_module
    (tmp_path / "c.yaml").write_text(textwrap.dedent('''
        imports: [my_ops]
        data:
          source: {type: tfrecord, files: "x*"}
          features: {image: {dtype: string}}
          preprocess: [decode_image, invert_test_op]
          batch_size: 8
    '''))
    config = load_config(str(tmp_path / "c.yaml"), ["data.batch_size=16"])
    assert [op.op for op in config.data.preprocess] == ["decode_image", "invert_test_op"]
    assert config.data.batch_size == 16
    check_ops(config.data)  # the module's op is registered by the time the ops are checked
    with pytest.raises(ConfigError, match=r"imports\[0\]: cannot import module 'not_a_module_xyz'"):
        load_config(str(tmp_path / "c.yaml"), ["imports=[not_a_module_xyz]"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    (tmp_path / "bad.yaml").write_text("data: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(tmp_path / "bad.yaml"))


def test_shipped_configs_validate():
    import glob

    from tpu_pipeline.demo import DEMO_CONFIG

    paths = sorted(glob.glob("configs/*.yaml")) or sorted(glob.glob("../configs/*.yaml"))
    assert paths, "configs/ must hold at least one example"
    paths.append(DEMO_CONFIG)
    for path in paths:
        config = load_config(path)
        assert config.data is not None, path
        for prefix in ("data", "eval_data"):
            check_ops(getattr(config, prefix), prefix)
            for section in ("preprocess", "augment"):  # every factory accepts its values
                build_ops(getattr(getattr(config, prefix), section, []), f"{prefix}.{section}")


def test_a_key_set_twice_in_a_yaml_file_is_an_error_naming_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  batch_size: 64\n  seed: 1\n  batch_size: 128\n")
    with pytest.raises(ConfigError, match=r"c.yaml', line 4: key 'batch_size' is already set on line 2; keep one"):
        load_config(str(path))
