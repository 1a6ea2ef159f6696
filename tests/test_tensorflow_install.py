"""Tests for tpu_pipeline.tensorflow_install: what is installed, whether libtpu may load, decided before
TensorFlow's import, from a /dev folder and an environment given to it (a TPU VM is faked with a file)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from tpu_pipeline import tensorflow_install as install_lib
from tpu_pipeline.tensorflow_install import TensorFlowInstall

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_IMPORTED: dict = {}  # `modules` for prepare_tensorflow_import: TensorFlow not imported yet


def tpu_install(tensorflow="2.19.1", libtpu="0.0.10", pin="==0.0.10", *, others=()) -> TensorFlowInstall:
    return TensorFlowInstall(tuple(sorted((("tensorflow-tpu", tensorflow), *others))), "2.19.0", libtpu, pin)


MATCHING = tpu_install()
MISMATCHED = tpu_install(libtpu="0.0.52")
PLAIN = TensorFlowInstall((("tensorflow", "2.21.0"),), "2.21.0", None, None)


@pytest.fixture
def dev(tmp_path):
    """An empty /dev; `touch(name)` makes a device file."""
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").touch()  # the VFIO control node: on many hosts with no TPU
    return tmp_path


@pytest.fixture(autouse=True)
def held_back(monkeypatch):
    """prepare_tensorflow_import writes a module global: each test starts from none and leaves the real one."""
    monkeypatch.setattr(install_lib, "LIBTPU_HELD_BACK", None)


# --------------------------------------------------------------------------------------------
# libtpu_mismatch


@pytest.mark.parametrize("install, expected", [
    (MATCHING, None),
    (MISMATCHED, "tensorflow-tpu 2.19.1 pins libtpu 0.0.10 but libtpu 0.0.52 is installed"),
    (tpu_install("2.20.0", "0.0.52", "~=0.0.14"),
     "tensorflow-tpu 2.20.0 aborts `import tensorflow` with libtpu 0.0.52 (measured: 0.0.40 and newer; its metadata "
     "asks only libtpu~=0.0.14)"),
    (tpu_install("2.20.0", "0.0.30", "~=0.0.14"), None),  # loads (and needs TPU_SKIP_MDS_QUERY off a TPU VM)
    (tpu_install(libtpu=None), None),  # nothing to mismatch: no libtpu package
    (PLAIN, None),  # the plain TensorFlow never loads libtpu
])
def test_libtpu_mismatch(install, expected):
    assert install_lib.libtpu_mismatch(install) == expected


def test_describe_names_every_distribution():
    assert MATCHING.describe() == "tensorflow-tpu 2.19.1, tf-keras 2.19.0, libtpu 0.0.10"
    assert PLAIN.describe() == "tensorflow 2.21.0, tf-keras 2.21.0, libtpu not installed as a package"
    two = tpu_install(others=[("tensorflow", "2.19.1")])
    assert two.describe().startswith("tensorflow 2.19.1 + tensorflow-tpu 2.19.1, ")
    assert two.is_tpu_distribution and not PLAIN.is_tpu_distribution


# --------------------------------------------------------------------------------------------
# Attached: device files and Colab's TPU runtime, never an installed libtpu


def test_attached_tpu_from_device_files_and_colab(dev):
    assert install_lib.attached_tpu_device(str(dev)) is None
    assert install_lib.attached_tpu({}, str(dev)) is None
    colab = {"COLAB_TPU_1VM": "1", "TPU_ACCELERATOR_TYPE": "v2-8"}
    assert install_lib.attached_tpu(colab, str(dev)) == "Colab's TPU runtime (COLAB_TPU_1VM=1, TPU_ACCELERATOR_TYPE=v2-8)"
    assert install_lib.colab_tpu_runtime({"COLAB_TPU_1VM": ""}) is None  # Colab's CPU and GPU runtimes
    assert install_lib.colab_tpu_runtime({"COLAB_TPU_ADDR": "10.0.0.2:8470"}) is None  # legacy: a remote TPU
    (dev / "vfio" / "0").touch()
    assert install_lib.attached_tpu(colab, str(dev)) == f"TPU device file {dev}/vfio/0"
    (dev / "accel0").touch()
    assert install_lib.attached_tpu_device(str(dev)) == f"{dev}/accel0"


# --------------------------------------------------------------------------------------------
# prepare_tensorflow_import


def test_no_tpu_device_starts_tensorflow_without_libtpu(dev):
    env: dict = {}
    reason = install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED, MATCHING)
    assert reason == "this machine has no TPU device (/dev/accel*, /dev/vfio/N)"
    assert env == {"TPU_LOAD_LIBRARY": "0", install_lib.HELD_BACK_ENV: reason}
    assert install_lib.LIBTPU_HELD_BACK == reason
    assert install_lib.libtpu_not_loaded(env, str(dev)) == (reason, "nothing: there is no TPU here to load it for")


def test_device_and_matching_libtpu_lets_it_load(dev):
    (dev / "accel0").touch()
    env: dict = {}
    assert install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED, MATCHING) is None
    assert env == {} and install_lib.libtpu_not_loaded(env, str(dev)) is None
    # Colab's TPU runtime counts as attached too (its own variables say so).
    (dev / "accel0").unlink()
    colab = {"COLAB_TPU_1VM": "1"}
    assert install_lib.prepare_tensorflow_import(colab, str(dev), NOT_IMPORTED, MATCHING) is None
    assert colab == {"COLAB_TPU_1VM": "1"}


def test_device_and_mismatched_libtpu_holds_it_back_with_the_reason(dev):
    (dev / "vfio" / "0").touch()
    env: dict = {}
    reason = install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED, MISMATCHED)
    assert reason == "tensorflow-tpu 2.19.1 pins libtpu 0.0.10 but libtpu 0.0.52 is installed"
    assert env["TPU_LOAD_LIBRARY"] == "0"
    assert install_lib.libtpu_not_loaded(env, str(dev)) == (reason, install_lib.TPU_FIX)


@pytest.mark.parametrize("value", ["0", "1"])
def test_users_own_tpu_load_library_is_respected(dev, value):
    env = {"TPU_LOAD_LIBRARY": value}
    assert install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED, MATCHING) is None
    assert env == {"TPU_LOAD_LIBRARY": value}
    (dev / "accel0").touch()
    expected = ("TPU_LOAD_LIBRARY=0 is set in the environment", "unset TPU_LOAD_LIBRARY") if value == "0" else None
    assert install_lib.libtpu_not_loaded(env, str(dev)) == expected


def test_inherited_switch_is_decided_again(dev):
    """A child process inherits our TPU_LOAD_LIBRARY=0 with its reason: it decides for itself, as the parent did."""
    env = {"TPU_LOAD_LIBRARY": "0", install_lib.HELD_BACK_ENV: "an old reason"}
    (dev / "accel0").touch()
    assert install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED, MATCHING) is None
    assert env == {}


def test_tensorflow_already_imported_changes_nothing(dev):
    env: dict = {}
    assert install_lib.prepare_tensorflow_import(env, str(dev), {"tensorflow": tf}, MATCHING) is None
    assert env == {} and install_lib.LIBTPU_HELD_BACK is None
    # The default `modules` is sys.modules, where this test process has TensorFlow.
    assert install_lib.prepare_tensorflow_import(env, str(dev)) is None and env == {}


# --------------------------------------------------------------------------------------------
# installed(): read from the distributions' own metadata, as pip leaves it


@pytest.fixture
def site(tmp_path_factory, monkeypatch) -> Path:
    """An empty site-packages that is the whole of sys.path for the test: the distributions written into it are
    the only ones importlib.metadata finds (the suite's venv has no tensorflow-tpu to read a pin from)."""
    folder = tmp_path_factory.mktemp("site-packages")
    monkeypatch.setattr(sys, "path", [str(folder)])
    return folder


def write_distribution(site: Path, name: str, version: str, *requires: str) -> None:
    """A `<name>-<version>.dist-info` folder with its METADATA, as pip writes it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("requirement", ["libtpu==0.0.10", "libtpu (==0.0.10)", 'libtpu==0.0.10; extra == "tpu"'])
def test_pin_read_from_metadata_holds_a_mismatched_libtpu_back(dev, site, requirement: str) -> None:
    """tensorflow-tpu's own libtpu pin, read from its metadata, decides on a TPU VM: a libtpu that misses it is kept
    out of `import tensorflow` (which would abort or hang); a pin misread as none would let it load."""
    write_distribution(site, "tensorflow-tpu", "2.19.1", "numpy>=1.26", requirement)
    write_distribution(site, "tf-keras", "2.19.0")
    write_distribution(site, "libtpu", "0.0.52")
    (dev / "accel0").touch()
    env: dict = {}
    reason = install_lib.prepare_tensorflow_import(env, str(dev), NOT_IMPORTED)  # install: read from `site`
    assert reason == "tensorflow-tpu 2.19.1 pins libtpu 0.0.10 but libtpu 0.0.52 is installed"
    assert env == {"TPU_LOAD_LIBRARY": "0", install_lib.HELD_BACK_ENV: reason}
    assert install_lib.installed() == MISMATCHED


def test_installed_lists_both_tensorflow_distributions(site) -> None:
    """tf-keras installed without --no-deps puts the registry's tensorflow beside tensorflow-tpu: installed() must
    list both, or the resolver's two-distributions dead end (tpu_stack.dead_end) never sees them."""
    write_distribution(site, "tensorflow-tpu", "2.19.1", "libtpu==0.0.10")
    write_distribution(site, "tensorflow", "2.19.1", 'nvidia-cublas-cu12; extra == "and-cuda"')
    write_distribution(site, "tf-keras", "2.19.0", "tensorflow<2.20,>=2.19")
    write_distribution(site, "libtpu", "0.0.10")
    install = install_lib.installed()
    assert install == tpu_install(others=[("tensorflow", "2.19.1")])
    assert install.describe() == "tensorflow 2.19.1 + tensorflow-tpu 2.19.1, tf-keras 2.19.0, libtpu 0.0.10"


# --------------------------------------------------------------------------------------------
# This process: the real distributions and build, and the commands the messages give


def test_this_process_build_and_install_agree():
    install = install_lib.installed()
    build = install_lib.tensorflow_build(tf)
    assert build in ("TPU", "CUDA", "CPU")
    assert (build == "TPU") == install.is_tpu_distribution
    assert tf.__version__ in {version for _, version in install.tensorflow}
    line = install_lib.libtpu_line(build, install)
    assert line.startswith(f"libtpu: {install.libtpu or 'no package installed'}; ")
    if build != "TPU":
        assert line.endswith(f"unused (a {build} build of TensorFlow has no TPU kernels)")
    elif install_lib.attached_tpu() is None:  # a machine with no TPU: libtpu was kept out
        assert "not loaded: this machine has no TPU device" in line


def test_libtpu_line_when_tensorflow_loads_it():
    line = install_lib.libtpu_line("TPU", MATCHING, {"TPU_LIBRARY_PATH": "/lib/libtpu.so"})
    assert line == "libtpu: 0.0.10; TensorFlow loads it at import (from /lib/libtpu.so)"


def test_fix_commands_install_what_setup_env_pins():
    """The pip command in every TPU error is the one scripts/setup_env.sh --tpu runs, pin for pin."""
    with open(os.path.join(REPO, "scripts", "setup_env.sh"), encoding="utf-8") as handle:
        script = handle.read()
    pins = dict(re.findall(r'^(TPU_TENSORFLOW|TPU_LIBTPU)="([^"]+)"', script, re.MULTILINE))
    assert pins == {"TPU_TENSORFLOW": f"tensorflow-tpu=={install_lib.TESTED_TPU_TENSORFLOW}",
                    "TPU_LIBTPU": f"libtpu=={install_lib.TESTED_LIBTPU}"}
    for pin in pins.values():
        assert f'"{pin}"' in install_lib.TPU_PIP_COMMAND
    minor = ".".join(install_lib.TESTED_TPU_TENSORFLOW.split(".")[:2])
    assert f'pip install --no-deps "tf-keras~={minor}.0"' in install_lib.TPU_PIP_COMMAND
    assert install_lib.TPU_PIP_COMMAND.startswith("pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu && ")
    assert install_lib.TPU_SETUP_COMMAND in install_lib.TPU_FIX and "--tpu" in script
