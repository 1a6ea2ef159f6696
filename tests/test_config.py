"""Config validation: each error names the dotted key and what is allowed."""
from __future__ import annotations

import textwrap

import pytest

from tpu_pipeline.config import apply_overrides, config_from_dict, load_config
from tpu_pipeline.errors import ConfigError

from helpers import data_config


def check_error(raw: dict, *fragments: str) -> str:
    with pytest.raises(ConfigError) as error:
        config_from_dict(raw)
    for fragment in fragments:
        assert fragment in str(error.value)
    return str(error.value)


def test_unknown_key_names_the_key_and_the_allowed_ones():
    raw = {"data": data_config("x*")}
    raw["data"]["shuffle"] = {"buffer_size": 10, "sead": 1}
    check_error(raw, "data.shuffle.sead: unknown key", "allowed keys here: buffer_size, enabled, mode, reshuffle_each_iteration, seed")


def test_unknown_key_inside_the_source_union():
    raw = {"data": data_config("x*")}
    raw["data"]["source"]["cycle_lenght"] = 4
    check_error(raw, "data.source.cycle_lenght: unknown key", "cycle_length")


def test_unknown_section():
    check_error({"dta": {}}, "unknown config section(s) dta", "data")


def test_wrong_type_and_negative_values():
    raw = {"data": data_config("x*", batch_size="many")}
    raw["data"]["shuffle"] = {"buffer_size": -5}
    message = check_error(raw, "data.batch_size", "data.shuffle.buffer_size", "greater than 0")
    assert "'many'" in message and "-5" in message


def test_cache_after_a_random_op_is_refused():
    raw = {"data": data_config("x*", cache={"enabled": True})}
    raw["data"]["preprocess"].insert(1, {"op": "random_flip"})
    check_error(raw, "data.preprocess[1]", "random_flip", "data.augment", "data.cache.enabled=false")


def test_unknown_op_and_bad_op_arguments():
    raw = {"data": data_config("x*", preprocess=[{"op": "resize_me"}])}
    check_error(raw, "data.preprocess[0]", "unknown preprocessing op 'resize_me'", "resize")
    raw = {"data": data_config("x*", augment=[{"op": "resize", "sise": 3}])}
    check_error(raw, "data.augment[0]", "op 'resize'", "size, key='image'")
    raw = {"data": data_config("x*", preprocess=[{"op": "cast", "dtype": "float99"}])}
    check_error(raw, "data.preprocess[0]", "float99")


def test_eval_section_reports_its_own_prefix():
    raw = {"eval_data": data_config("x*", prefetch=-1)}
    check_error(raw, "eval_data.prefetch")


def test_options_enum_values():
    raw = {"data": data_config("x*", options={"auto_shard_policy": "sometimes"})}
    check_error(raw, "data.options.auto_shard_policy", "'auto'", "'off'")


def test_overrides_reach_any_key_including_list_items():
    raw = {"data": data_config("x*")}
    result = apply_overrides(raw, ["data.batch_size=256", "data.preprocess.1.size=[32, 48]", "data.options.slack=true", "data.shuffle.seed=null"])
    config = config_from_dict(result)
    assert config.data.batch_size == 256
    assert config.data.preprocess[1].args == {"size": [32, 48]}
    assert config.data.options.slack is True and config.data.shuffle.seed is None
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


def test_yaml_file_with_imports_registers_user_ops(tmp_path, monkeypatch):
    (tmp_path / "my_ops.py").write_text(textwrap.dedent('''
        import tensorflow as tf
        from tpu_pipeline import register_op

        @register_op("invert_test_op", replace=True)
        def invert(key="image"):
            def fn(features, seed=None):
                return {**features, key: 255.0 - tf.cast(features[key], tf.float32)}
            return fn
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
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

    paths = sorted(glob.glob("configs/*.yaml")) or sorted(glob.glob("../configs/*.yaml"))
    assert paths, "configs/ must hold at least one example"
    for path in paths:
        assert load_config(path).data is not None, path
