"""Can this process drive the TPU of this machine? Decided before any TPU call, said in one line.

Why: a TPU VM whose Python holds the registry's plain TensorFlow (no TPU kernels), two TensorFlow
distributions in one folder, or a libtpu held back for a mismatch, fails deep inside
`initialize_tpu_system` with TensorFlow's own error; auto mode then trained on the host's CPU while the
TPU was billed. `dead_end` names each case: what is installed, why it cannot drive the TPU, the fix.
Remote TPUs (a grpc:// address, a Cloud TPU by name) need no TPU kernels here and are not checked.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import tensorflow as tf

from tpu_pipeline import tensorflow_install as install_lib
from tpu_pipeline.config.cluster import ClusterConfig

LOCAL = "local"
NO_DEVICE = "no /dev/accel* or /dev/vfio/N device file"


@dataclasses.dataclass(frozen=True)
class TensorFlowStack:
    """The imported TensorFlow as it bears on a TPU of this machine."""

    build: str  # 'TPU', 'CUDA' or 'CPU': what the imported TensorFlow was built for
    version: str  # tf.__version__ (where two distributions share the folder: the files that won)
    install: install_lib.TensorFlowInstall
    libtpu_off: tuple[str, str] | None = None  # (why TensorFlow did not load libtpu, the fix)

    def describe(self) -> str:
        """For `devices`, e.g. `2.19.1, TPU build (tensorflow-tpu 2.19.1); tf-keras 2.19.0`: the version imported,
        then the distributions installed (two, where tf-keras brought the registry's `tensorflow` in)."""
        distributions = " + ".join(f"{name} {version}" for name, version in self.install.tensorflow) or "no distribution"
        keras = self.install.tf_keras or "not installed"
        return f"{self.version}, {self.build} build ({distributions}); tf-keras {keras}"


def current_stack() -> TensorFlowStack:
    """The real process's stack (what `TfTpuBackend.tensorflow_stack` reports)."""
    return TensorFlowStack(install_lib.tensorflow_build(tf), tf.__version__, install_lib.installed(),
                           install_lib.libtpu_not_loaded())


@dataclasses.dataclass(frozen=True)
class LocalTpu:
    """Why this run is meant for a TPU of this machine, and what shows one is attached (None: nothing)."""

    why: str
    attached: str | None
    named_by: str | None = None  # 'TPU_NAME' or 'cluster.tpu' when 'local' was named


def local_tpu(config: ClusterConfig, env: Mapping[str, str], device: str | None) -> LocalTpu | None:
    """A TPU of this machine named (`cluster.tpu=local`, `TPU_NAME=local`) or attached (a device file,
    Colab's TPU runtime); None otherwise, e.g. for a remote `cluster.tpu`."""
    attached = device or install_lib.colab_tpu_runtime(env)
    if config.tpu:
        named_by = "cluster.tpu" if config.tpu == LOCAL else None
    else:
        named_by = "TPU_NAME" if env.get("TPU_NAME", "").strip() == LOCAL else None
    if named_by:
        return LocalTpu(f"{named_by}=local asks for the TPU of this machine", attached, named_by)
    if attached and not config.tpu:
        return LocalTpu(f"a TPU is attached to this machine ({attached})", attached)
    return None


def dead_end(local: LocalTpu, stack: TensorFlowStack) -> str | None:
    """One line when this process cannot drive the TPU it is meant for; None when it may."""
    installed = f"installed: {stack.install.describe()}"
    if local.attached is None:
        if local.named_by == "TPU_NAME":
            fix = ("unset TPU_NAME (or set it to your Cloud TPU's name, with TPU_ZONE and TPU_PROJECT), or train on "
                   "this CPU with cluster.accelerator=cpu")
        else:
            fix = "drop cluster.tpu=local to train on this machine's CPU or GPUs, or name your Cloud TPU: cluster.tpu=<name>"
        return f"{local.why}, but this machine has no TPU ({NO_DEVICE}); {installed}. Fix: {fix}"
    if len(stack.install.tensorflow) > 1:
        both = " and ".join(f"{name} {version}" for name, version in stack.install.tensorflow)
        return (f"{local.why}, but {both} are installed together: two TensorFlow distributions write one "
                f"tensorflow/ folder, so the TensorFlow imported ({stack.version}) is a mix of both; {installed}. "
                f"Fix: {install_lib.TPU_FIX}")
    if stack.build != "TPU":
        return (f"{local.why}, but TensorFlow {stack.version} here is a {stack.build} build, which has no TPU kernels "
                f"(the TPU build is the tensorflow-tpu distribution); {installed}. Fix: {install_lib.TPU_FIX}")
    if stack.libtpu_off is not None:
        why, fix = stack.libtpu_off
        return f"{local.why}, but TensorFlow did not load libtpu: {why}; {installed}. Fix: {fix}"
    return None
