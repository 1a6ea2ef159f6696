"""The whole config: one strict section per layer."""
from __future__ import annotations

from typing import Optional

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.config.train import TrainConfig


class Config(StrictModel):
    """Top level of a YAML config file. Every section is optional; each layer reads its own."""

    imports: list[str] = []
    data: Optional[DataConfig] = None
    eval_data: Optional[DataConfig] = None
    cluster: ClusterConfig = ClusterConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
