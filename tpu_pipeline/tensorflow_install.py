"""Which TensorFlow is installed, whether a TPU is attached, and what that pair can do — read without
importing TensorFlow.

Why it exists: a TPU TensorFlow (`tensorflow-tpu`) loads libtpu at `import tensorflow`. On a machine
with no TPU, libtpu 0.0.10 (what tensorflow-tpu 2.19.1 pins) retries the GCE metadata server for
minutes; libtpu 0.0.40 and newer under tensorflow-tpu 2.20 abort the process. Neither can be caught
once TensorFlow is importing, so `prepare_tensorflow_import()` (run when `tpu_pipeline` is imported)
decides first: with no TPU device on this machine, or a libtpu known not to match, TensorFlow starts
without libtpu (`TPU_LOAD_LIBRARY=0`, TensorFlow's own switch) and the resolver names the problem in
one line instead. The TPU build tested here, and its pins, are in `scripts/setup_env.sh`.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.metadata as metadata
import os
import re
import sys
from typing import Mapping, MutableMapping

# The TPU TensorFlow this package is tested with (scripts/setup_env.sh --tpu gives the reasons).
TESTED_TPU_TENSORFLOW = "2.19.1"
TESTED_LIBTPU = "0.0.10"
TPU_SETUP_COMMAND = "bash scripts/setup_env.sh --tpu"
# What setup_env.sh --tpu does, for a pip user. tensorflow-tpu goes out too: uninstalling `tensorflow`
# beside it deletes files of the one `tensorflow/` folder both wrote, and pip would not reinstall them.
TPU_PIP_COMMAND = ('pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu && pip install "tensorflow-tpu==2.19.1" '
                   '"libtpu==0.0.10" && pip install --no-deps "tf-keras~=2.19.0"')
TPU_FIX = f"{TPU_SETUP_COMMAND} (in this repository), or: {TPU_PIP_COMMAND}"

# Distributions that each ship the `tensorflow` package folder.
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-tpu", "tensorflow-cpu", "tensorflow-intel", "tf-nightly",
                             "tf-nightly-tpu", "tf-nightly-cpu")
# Measured here: tensorflow-tpu 2.20.0 aborts `import tensorflow` ("ConfigureDistributedTpuOp_DoWork not
# available in this library") with libtpu 0.0.40, 0.0.46.3, 0.0.49 and 0.0.52; its metadata allows them all.
_ABORTING_LIBTPU = {"2.20": (0, 0, 40)}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _release(version: str) -> tuple[int, ...]:
    """`0.0.46.3` -> (0, 0, 46, 3); `2.19.1rc0` -> (2, 19, 1)."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


@dataclasses.dataclass(frozen=True)
class TensorFlowInstall:
    """The installed distributions that matter for a TPU, as pip lists them."""

    tensorflow: tuple[tuple[str, str], ...]  # (distribution, version) for each that ships `tensorflow/`
    tf_keras: str | None
    libtpu: str | None
    libtpu_pin: str | None  # what the TPU TensorFlow's own metadata asks of libtpu, e.g. '==0.0.10'

    @property
    def is_tpu_distribution(self) -> bool:
        return any(name in ("tensorflow-tpu", "tf-nightly-tpu") for name, _ in self.tensorflow)

    def describe(self) -> str:
        """e.g. `tensorflow-tpu 2.19.1, tf-keras 2.19.0, libtpu 0.0.10`."""
        tensorflow = " + ".join(f"{name} {version}" for name, version in self.tensorflow) or "no TensorFlow"
        return (f"{tensorflow}, tf-keras {self.tf_keras or 'not installed'}, "
                f"libtpu {self.libtpu or 'not installed as a package'}")


def installed() -> TensorFlowInstall:
    """What pip installed (importlib.metadata: no TensorFlow import)."""
    tensorflow, pin = [], None
    for dist in metadata.distributions():
        name = _normalized(dist.metadata["Name"])
        if name in _TENSORFLOW_DISTRIBUTIONS:
            tensorflow.append((name, dist.version))
            for requirement in dist.requires or []:
                if _normalized(re.split(r"[\s<>=!~;(\[]", requirement, maxsplit=1)[0]) == "libtpu":
                    pin = re.sub(r"^[A-Za-z0-9_.\-]+\s*", "", requirement.split(";")[0]).strip("() ") or None
    return TensorFlowInstall(tuple(sorted(set(tensorflow))), _version("tf-keras"), _version("libtpu"), pin)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def attached_tpu_device(dev: str = "/dev") -> str | None:
    """A TPU device file of this machine (a TPU VM: /dev/accel* on v2-v4, /dev/vfio/N on v5e and later), or None.

    An installed libtpu is no evidence: the TPU environment installs it on any machine.
    """
    accel = sorted(glob.glob(os.path.join(dev, "accel*")))
    if accel:
        return accel[0]
    vfio = sorted(p for p in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(p).isdigit())
    return vfio[0] if vfio else None


def colab_tpu_runtime(env: Mapping[str, str] = os.environ) -> str | None:
    """Colab's TPU VM runtime, from the variables it sets, or None.

    Colab's start-up script tests `COLAB_TPU_1VM == "1"` (other runtimes set it empty); its TPU runtimes
    also set TPU_ACCELERATOR_TYPE (e.g. v5e-1), TPU_SKIP_MDS_QUERY=1 and TPU_WORKER_HOSTNAMES=localhost.
    The legacy COLAB_TPU_ADDR (a TPU Node reached over grpc) is a remote TPU, not this machine's.
    """
    if env.get("COLAB_TPU_1VM", "").strip() != "1":
        return None
    kind = env.get("TPU_ACCELERATOR_TYPE", "").strip()
    return "Colab's TPU runtime (COLAB_TPU_1VM=1" + (f", TPU_ACCELERATOR_TYPE={kind})" if kind else ")")


def attached_tpu(env: Mapping[str, str] = os.environ, dev: str = "/dev") -> str | None:
    """Why we believe a TPU is attached to this machine (a device file, Colab's TPU runtime), or None."""
    device = attached_tpu_device(dev)
    return f"TPU device file {device}" if device else colab_tpu_runtime(env)


def libtpu_mismatch(install: TensorFlowInstall) -> str | None:
    """Why this TPU TensorFlow cannot load this libtpu (its own pin unmet, or a pair measured to abort), or None."""
    tpu_versions = [version for name, version in install.tensorflow if name in ("tensorflow-tpu", "tf-nightly-tpu")]
    if not tpu_versions or install.libtpu is None:
        return None
    version, libtpu = tpu_versions[0], install.libtpu
    pin = install.libtpu_pin or ""
    if pin.startswith("==") and _release(pin[2:].strip()) != _release(libtpu):
        return f"tensorflow-tpu {version} pins libtpu {pin[2:].strip()} but libtpu {libtpu} is installed"
    floor = _ABORTING_LIBTPU.get(".".join(version.split(".")[:2]))
    if floor is not None and _release(libtpu) >= floor:
        return (f"tensorflow-tpu {version} aborts `import tensorflow` with libtpu {libtpu} "
                f"(measured: 0.0.40 and newer; its metadata asks only libtpu{pin})")
    return None


NO_TPU_DEVICE = "this machine has no TPU device (/dev/accel*, /dev/vfio/N)"
# Set by prepare_tensorflow_import when it kept libtpu out: the resolver's one-line reason.
LIBTPU_HELD_BACK: str | None = None
# Beside our TPU_LOAD_LIBRARY=0, the reason: a child process inherits both and decides again, rather than
# taking our switch for the user's own.
HELD_BACK_ENV = "TPU_PIPELINE_LIBTPU_HELD_BACK"


def prepare_tensorflow_import(env: MutableMapping[str, str] = os.environ, dev: str = "/dev",
                              modules: Mapping[str, object] = sys.modules,
                              install: TensorFlowInstall | None = None) -> str | None:
    """Before TensorFlow's first import: start it without libtpu where libtpu would hang or abort.

    Returns why libtpu was held back (None when it may load, or TensorFlow is already imported, or the
    user set TPU_LOAD_LIBRARY themselves).
    """
    global LIBTPU_HELD_BACK
    if "tensorflow" in modules:
        return None
    if HELD_BACK_ENV in env and env.get("TPU_LOAD_LIBRARY") == "0":  # ours, inherited: decide again
        del env["TPU_LOAD_LIBRARY"], env[HELD_BACK_ENV]
    if "TPU_LOAD_LIBRARY" in env:
        return None
    if attached_tpu(env, dev) is None:
        reason = NO_TPU_DEVICE
    else:
        reason = libtpu_mismatch(install or installed())
        if reason is None:
            return None
    env["TPU_LOAD_LIBRARY"] = "0"
    env[HELD_BACK_ENV] = reason
    LIBTPU_HELD_BACK = reason
    return reason


def libtpu_not_loaded(env: Mapping[str, str] = os.environ, dev: str = "/dev") -> tuple[str, str] | None:
    """(why TensorFlow did not load libtpu in this process, what fixes it), or None where TPU_LOAD_LIBRARY
    let it load (whether it did is TensorFlow's: e.g. another process holding the TPU stops it)."""
    if env.get("TPU_LOAD_LIBRARY") != "0":
        return None
    # Ours, or (no TPU here) e.g. the start-up line setup_env.sh puts in .venv-tpu; else the user's own.
    why = LIBTPU_HELD_BACK or env.get(HELD_BACK_ENV) or (NO_TPU_DEVICE if attached_tpu(env, dev) is None else None)
    if why is None:
        return "TPU_LOAD_LIBRARY=0 is set in the environment", "unset TPU_LOAD_LIBRARY"
    return why, ("nothing: there is no TPU here to load it for" if why == NO_TPU_DEVICE else TPU_FIX)


def tensorflow_build(tf_module: object) -> str:
    """'TPU', 'CUDA' or 'CPU': what the imported TensorFlow was built for (a TPU build registers TPU kernels)."""
    from tensorflow.python.framework import kernels  # noqa: PLC0415 (TensorFlow is imported by the caller)

    if kernels.get_registered_kernels_for_op("_TPUCompileMlir").kernel:
        return "TPU"
    build = getattr(getattr(tf_module, "sysconfig"), "get_build_info")()
    return "CUDA" if build.get("is_cuda_build") else "CPU"


def libtpu_line(build: str, install: TensorFlowInstall, env: Mapping[str, str] = os.environ) -> str:
    """For `devices`: libtpu's version and whether this process's TensorFlow loaded it, or why not."""
    version = f"libtpu: {install.libtpu or 'no package installed'}"
    if build != "TPU":
        return f"{version}; unused (a {build} build of TensorFlow has no TPU kernels)"
    off = libtpu_not_loaded(env)
    if off is not None:
        return f"{version}; not loaded: {off[0]}"
    where = env.get("TPU_LIBRARY_PATH") or ("the package" if install.libtpu else "libtpu.so on the library path")
    return f"{version}; TensorFlow loads it at import (from {where})"


def environment_summary(env: Mapping[str, str] = os.environ) -> str:
    """One line for `devices` and `doctor`: the distributions and whether libtpu may load."""
    line = installed().describe()
    off = libtpu_not_loaded(env)
    if off is not None:
        line += f"; libtpu not loaded ({off[0]})"
    return line
