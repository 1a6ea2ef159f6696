"""data.service without servers: the config, the plan's split, and every refusal as one line."""
from __future__ import annotations

import pytest
import tensorflow as tf

from helpers import data_config, write_jpeg_shards
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.stages.outputs import ToOutputs
from tpu_pipeline.pipeline.stages.prefetch import Prefetch
from tpu_pipeline.pipeline.stages.service_split import ServiceSplit

pytestmark = pytest.mark.tf_builds

REMOTE = "grpc://10.0.0.2:5050"  # never contacted: these tests stop before any dataset is read


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_jpeg_shards(str(tmp_path_factory.mktemp("service_config")), 32, 2)


def data_with(files: str, service: dict, **overrides):
    data = data_config(files, outputs={"inputs": "image", "targets": "label"}, **overrides)
    data["service"] = service
    return data


def test_the_plan_sends_every_stage_up_to_the_batches_to_the_workers(files):
    data = data_with(files, {"address": REMOTE})
    data["options"] = {}
    pipeline = Pipeline.from_config(config_from_dict({"data": data}).data)
    stages = list(pipeline.stages)
    split = pipeline.service
    assert isinstance(split, ServiceSplit) and split.address == REMOTE
    assert isinstance(stages[stages.index(split) - 1], ToOutputs)
    assert isinstance(stages[stages.index(split) + 1], Prefetch)
    explained = pipeline.plan.explain()
    assert "service       workers: read..batch, distributed_epoch" in explained
    # Exact order buys nothing once workers race; "auto" cores would be this host's, not a worker's.
    assert pipeline.plan.order.value is False and "depends on which worker answers first" in pipeline.plan.order.reason


def test_without_an_address_nothing_changes(files):
    pipeline = Pipeline.from_config(config_from_dict({"data": data_config(files)}).data)
    assert pipeline.service is None and pipeline.plan.service.value == "off"


@pytest.mark.parametrize("service, message", [
    ({"address": "10.0.0.2"}, "data.service.address='10.0.0.2': expected grpc://host:port"),
    ({"address": "http://10.0.0.2:5050"}, "expected grpc://host:port"),
    ({"address": REMOTE, "num_consumers": 2}, "data.service.num_consumers: coordinated reads share one job; set "
                                              "data.service.job_name too"),
    ({"address": REMOTE, "mode": "first_come"}, "data.service.mode"),
])
def test_bad_service_keys_are_one_line_errors(files, service, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        config_from_dict({"data": data_with(files, service)})


def test_evaluation_and_in_memory_arrays_and_file_caches_are_refused(files, tmp_path):
    import numpy as np

    from tpu_pipeline.pipeline.sources.arrays import ArraySource

    eval_section = data_with(files, {"address": REMOTE})
    with pytest.raises(ConfigError, match=r"eval_data\.service: exact evaluation reads every record once"):
        Pipeline.from_config(config_from_dict({"eval_data": eval_section}).eval_data, prefix="eval_data")
    arrays = ArraySource({"image": np.zeros((8, 4, 4, 3), np.float32), "label": np.zeros(8, np.int64),
                          "id": np.arange(8)})
    arrays_section = data_with(files, {"address": REMOTE}, preprocess=[])
    arrays_section.pop("features")
    arrays_section["source"] = {"type": "arrays", "path": str(tmp_path / "unused.npz")}
    with pytest.raises(ConfigError, match=r"ArraySource\) holds its data in this process's memory"):
        Pipeline.from_config(config_from_dict({"data": arrays_section}).data, source=arrays)
    cached = data_with(files, {"address": REMOTE}, cache={"enabled": True, "path": str(tmp_path / "cache")})
    with pytest.raises(ConfigError, match=r"data\.cache\.path with data\.service: every worker would write"):
        Pipeline.from_config(config_from_dict({"data": cached}).data)


def test_several_hosts_need_one_job_name_and_coordinated_reads_one_consumer_each(files):
    two_hosts = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    anonymous = Pipeline.from_config(config_from_dict({"data": data_with(files, {"address": REMOTE})}).data)
    with pytest.raises(ConfigError, match=r"2 trainer hosts read through the service and must share one job"):
        anonymous.build(two_hosts)
    named = data_with(files, {"address": REMOTE, "job_name": "run-7", "num_consumers": 4})
    with pytest.raises(ConfigError, match=r"num_consumers=4, but 2 trainer host\(s\) read"):
        Pipeline.from_config(config_from_dict({"data": named}).data).build(two_hosts)


def test_a_resumed_stream_reads_a_job_of_its_own():
    split = ServiceSplit(REMOTE, job_name="run-7")
    one_host = tf.distribute.InputContext()
    assert split.job(one_host, 0) == "run-7"
    assert split.job(one_host, 3) == "run-7/from-epoch-3"  # another dataset: the old job's name would refuse it
    assert ServiceSplit(REMOTE).job(one_host, 0) is None


def test_skipped_records_copied_on_this_host_are_refused_for_remote_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_CACHE", str(tmp_path / "cache"))
    files = write_jpeg_shards(str(tmp_path / "data"), 32, 2)
    path = sorted(tf.io.gfile.glob(files))[1]
    raw = bytearray(open(path, "rb").read())
    raw[-10] ^= 0xFF  # the last record's bytes: its CRC fails
    open(path, "wb").write(bytes(raw))
    data = data_with(files, {"address": REMOTE}, on_error="skip", max_skipped=2)
    with pytest.raises(ConfigError, match=r"on_error=skip wrote checked copies of 1 damaged file\(s\) on this host"):
        Pipeline.from_config(config_from_dict({"data": data}).data)
    data["service"] = {"address": "grpc://localhost:5050"}  # workers on this host read the copies
    assert Pipeline.from_config(config_from_dict({"data": data}).data).skipped.skipped == 1


@pytest.mark.parametrize("args, message", [
    (["serve"], "name one role, dispatcher or worker (got none), e.g. `tpu-pipeline serve dispatcher --port 5050`"),
    (["serve", "worker"], "worker: --dispatcher is required, e.g. --dispatcher dispatcher-host:5050"),
    (["serve", "dispatcher", "--dispatcher", "x:1"], "dispatcher: --dispatcher and --address are worker flags"),
    (["serve", "worker", "--dispatcher", "nohost"],
     "dispatcher address 'nohost': expected host:port or grpc://host:port, e.g. grpc://10.0.0.2:5050"),
])
def test_serve_usage_mistakes_are_one_line(tmp_path, args, message):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *args], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"tpu-pipeline serve: error: {message}"]


def test_doctor_measures_this_hosts_pipeline_and_says_when_service_workers_would_help(tmp_path):
    import dataclasses

    from helpers import small_config, write_small_shards
    from tpu_pipeline.bench.doctor import diagnose, service_advice

    shards = write_small_shards(tmp_path, 1000, num_shards=2)[0]
    data = small_config(shards, repeat="forever")
    data["service"] = {"address": REMOTE}  # never contacted: the doctor measures this host alone
    diagnosis = diagnose(config_from_dict({"data": data}).data, batches=5, repeats=1, measure_tuned=False)
    assert diagnosis.plan.service.value == "off"

    per_core = diagnosis.ceilings.one_thread.examples_per_sec
    at_limit = dataclasses.replace(diagnosis, ceilings=dataclasses.replace(diagnosis.ceilings, read=None),
                                   pipeline=dataclasses.replace(diagnosis.pipeline,
                                                                examples_per_sec=diagnosis.ceilings.compute_bound))
    waited = {"input_wait_fraction": 0.5, "examples_per_sec": 3 * per_core}
    advice = service_advice(at_limit, waited)
    # Without waiting, the accelerator would take 6 cores' worth.
    assert advice.startswith("training waited for input 50% of its step time while this host's pipeline runs at its "
                             "CPU limit")
    assert "needs about 6 worker cores" in advice
    assert service_advice(at_limit, {"input_wait_fraction": 0.02, "examples_per_sec": per_core}) is None
    assert "if training waits for input" in service_advice(at_limit, None)
    below = dataclasses.replace(at_limit, pipeline=dataclasses.replace(at_limit.pipeline, examples_per_sec=1.0))
    assert service_advice(below, waited) is None  # tuning, not more cores, is the fix there
