"""Composable tf.data stages and the Pipeline that builds them per input pipeline. No Keras here."""
from tpu_pipeline.pipeline.builder import Pipeline, build_dataset
from tpu_pipeline.pipeline.checks.tpu_check import check_tpu_compatible, tpu_problems
from tpu_pipeline.pipeline.plan import Decision, Plan, make_plan
from tpu_pipeline.pipeline.source_factory import source_from_config
from tpu_pipeline.pipeline.sources.arrays import ArraySource
from tpu_pipeline.pipeline.sources.base import ReadOptions, Source
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.sources.files import list_files
from tpu_pipeline.pipeline.sources.sharding import choose_sharding
from tpu_pipeline.pipeline.sources.tfds import TFDSSource
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.pipeline.stage_assembly import stages_from_plan
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.batching import Batch, per_replica_batch_size
from tpu_pipeline.pipeline.stages.cache import Cache
from tpu_pipeline.pipeline.stages.map_features import MapFeatures
from tpu_pipeline.pipeline.stages.options import WithOptions, make_options
from tpu_pipeline.pipeline.stages.outputs import ToOutputs
from tpu_pipeline.pipeline.stages.parse import feature_spec, make_parser
from tpu_pipeline.pipeline.stages.prefetch import Prefetch
from tpu_pipeline.pipeline.stages.repeat import Repeat
from tpu_pipeline.pipeline.stages.shuffles import Shuffle, WindowShuffle

__all__ = [
    "ArraySource", "Batch", "Cache", "DatasetDirSource", "Decision", "MapFeatures", "Pipeline", "Plan", "Prefetch",
    "ReadOptions", "Repeat", "Shuffle", "Source", "Stage", "StageContext", "TFDSSource", "TFRecordSource", "ToOutputs", "WindowShuffle",
    "WithOptions", "build_dataset", "check_tpu_compatible", "choose_sharding", "feature_spec", "list_files",
    "make_options", "make_parser", "make_plan", "per_replica_batch_size", "source_from_config", "stages_from_plan",
    "tpu_problems",
]
