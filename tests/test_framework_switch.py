"""model.framework and KERAS_BACKEND: one switch, and a config and a variable that disagree are refused in one line."""
from __future__ import annotations

import pytest

from jax_child import requires_jax
from tpu_pipeline.config.framework import choose_framework
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ClusterError, ConfigError

pytestmark = pytest.mark.tf_independent


@pytest.mark.parametrize("section, env, framework, keras", [
    ({}, {}, "tensorflow", "tf_keras"),
    ({}, {"KERAS_BACKEND": "tensorflow"}, "tensorflow", "tf_keras"),
    ({}, {"KERAS_BACKEND": "jax"}, "jax", "keras3"),
    ({}, {"KERAS_BACKEND": " JAX "}, "jax", "keras3"),
    ({"framework": "jax"}, {}, "jax", "keras3"),
    ({"framework": "jax"}, {"KERAS_BACKEND": "jax"}, "jax", "keras3"),
    ({"keras": "keras3"}, {"KERAS_BACKEND": "jax"}, "jax", "keras3"),
    ({"framework": "tensorflow", "keras": "keras3"}, {}, "tensorflow", "keras3"),
])
def test_the_config_else_keras_backend_decides(section, env, framework, keras):
    chosen = choose_framework(ModelConfig.from_dict(section), env)
    assert (chosen.framework, chosen.keras) == (framework, keras)


@pytest.mark.parametrize("section, env, needle", [
    ({"framework": "jax"}, {"KERAS_BACKEND": "tensorflow"},
     "model.framework is jax but KERAS_BACKEND=tensorflow; make them agree"),
    ({"framework": "tensorflow"}, {"KERAS_BACKEND": "jax"},
     "model.framework is tensorflow but KERAS_BACKEND=jax; make them agree"),
    ({"keras": "tf_keras"}, {"KERAS_BACKEND": "jax"}, "model.keras: tf_keras has no JAX backend, but KERAS_BACKEND=jax"),
])
def test_a_config_and_keras_backend_that_disagree_are_refused_in_one_line(section, env, needle):
    with pytest.raises(ConfigError) as raised:
        choose_framework(ModelConfig.from_dict(section), env)
    assert needle in str(raised.value) and "\n" not in str(raised.value)


def test_tf_keras_on_jax_is_refused_by_the_config_itself():
    with pytest.raises(ConfigError, match="model.keras: tf_keras has no JAX backend, but model.framework is jax"):
        ModelConfig.from_dict({"framework": "jax", "keras": "tf_keras"})


def test_jax_process_keys_are_refused_on_the_tensorflow_path():
    from tpu_pipeline.cluster import resolve
    from tpu_pipeline.config.cluster import ClusterConfig

    with pytest.raises(ClusterError, match="cluster.coordinator_address is for model.framework jax"):
        resolve(ClusterConfig(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=0))


def test_the_run_identity_names_jax_and_leaves_tensorflow_runs_as_they_were():
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.config.identity import run_identity

    data = {"source": {"type": "tfrecord", "files": "/data/train-*"}, "batch_size": 8,
            "features": {"x": {"dtype": "int64"}}}
    tf_run = run_identity(config_from_dict({"data": data}))
    jax_run = run_identity(config_from_dict({"data": data, "model": {"framework": "jax"}}))
    assert "model.framework" not in tf_run  # as in every run directory started before JAX
    assert jax_run["model.framework"] == "jax" and jax_run["model.keras"] == "keras3"


def test_on_jax_steps_per_execution_divides_an_epoch():
    """Keras 3.15's JAX trainer runs each execution whole: 2 per execution over 7 steps would train 8."""
    from tpu_pipeline.model.builder import resolve_steps_per_execution

    jax = ModelConfig.from_dict({"framework": "jax"})
    assert resolve_steps_per_execution(jax, "tpu", 8, 100) == 25  # auto: 32 does not divide 100
    assert resolve_steps_per_execution(jax, "tpu", 8, 64) == 32
    explicit = ModelConfig.from_dict({"framework": "jax", "steps_per_execution": 2})
    assert resolve_steps_per_execution(explicit, "cpu", 8, 8) == 2
    with pytest.raises(ConfigError, match="model.steps_per_execution=2 does not divide train.steps_per_epoch=7"):
        resolve_steps_per_execution(explicit, "cpu", 8, 7)


def test_a_step_error_is_a_peer_failure_only_with_several_hosts_and_on_jax_only_when_it_says_so():
    """The JAX runtime error of a Gloo all-reduce whose peer hung up (measured text) stops the job with the
    PeerFailure line; a JAX error of the step's own (out of device memory) is raised as it is."""
    import tensorflow as tf

    from tpu_pipeline.cluster import ClusterInfo
    from tpu_pipeline.train.framework import is_peer_failure

    def cluster(hosts: int, framework: str) -> ClusterInfo:
        kind = "multi-worker" if framework == "tensorflow" else "cpu"  # TF_CONFIG workers; JAX processes
        return ClusterInfo(strategy=None, kind=kind, num_replicas=8, num_hosts=hosts, devices=(), framework=framework)

    gloo = RuntimeError("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error "
                        "[127.0.0.1]:59008: Connection reset by peer")
    memory = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.")
    unavailable = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: task 1 is unhealthy")
    assert is_peer_failure(gloo, cluster(2, "jax")) and is_peer_failure(unavailable, cluster(2, "tensorflow"))
    assert not is_peer_failure(memory, cluster(2, "jax"))
    assert not is_peer_failure(gloo, cluster(1, "jax")) and not is_peer_failure(unavailable, cluster(1, "tensorflow"))


@requires_jax
def test_on_jax_a_runtime_error_out_of_device_memory_is_the_steps_own_not_a_peers_death():
    """A JAX step raises every runtime failure as a JaxRuntimeError, which `peer_errors` catches on JAX: one that
    says RESOURCE_EXHAUSTED (out of device memory) must reach the user as it is, not as the PeerFailure line,
    whose advice (start every worker again) would run into the same error."""
    import jax

    from tpu_pipeline.cluster import ClusterInfo
    from tpu_pipeline.train.framework import is_peer_failure, peer_errors

    cluster = ClusterInfo(strategy=None, kind="cpu", num_replicas=8, num_hosts=2, devices=(), framework="jax")
    memory = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 "
                                        "bytes.")
    gloo = jax.errors.JaxRuntimeError("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] "
                                      "Read error [127.0.0.1]:59008: Connection reset by peer")
    assert isinstance(memory, peer_errors(cluster)) and isinstance(gloo, peer_errors(cluster))  # what is asked
    assert not is_peer_failure(memory, cluster)
    assert is_peer_failure(gloo, cluster)
