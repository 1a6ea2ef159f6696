"""Typed, validated configs with command-line style overrides."""
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.loader import apply_overrides, config_from_dict, load_config
from tpu_pipeline.config.schema import Config

__all__ = ["Config", "DataConfig", "apply_overrides", "config_from_dict", "load_config"]
