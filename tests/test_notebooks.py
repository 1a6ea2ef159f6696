"""Notebooks run top to bottom on CPU (small step counts), as a Colab user would run them.

Their first code cell installs the package in a fresh Colab runtime (no registry holds it): the same cell in
every notebook. Here, where the package is installed, it only says so; its install logic is tested below
through its own functions, with pip left out.
"""
from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile

import nbformat
import pytest
from nbclient import NotebookClient

from jax_child import jax_installed
from tpu_pipeline.tensorflow_install import TESTED_LIBTPU, TESTED_TPU_TENSORFLOW

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ("quickstart.ipynb", "pipeline_tuning.ipynb", "text_lm.ipynb")
INSTALL_CALL = "install_tpu_pipeline(TPU_PIPELINE_SOURCE)"
ALREADY_INSTALLED = "is already installed"


def execute(name: str, tmp_path) -> nbformat.NotebookNode:
    """Runs every cell in a fresh kernel (which inherits this process's environment) in tmp_path."""
    notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> tuple[str, list[str]]:
    text, mimes = [], []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", "") + str(output.get("data", {}).get("text/plain", "")))
            mimes.extend(output.get("data", {}).keys())
    return "\n".join(text), mimes


def test_quickstart_runs_top_to_bottom(tmp_path, monkeypatch, demo_cache):
    monkeypatch.setenv("TPU_PIPELINE_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TPU_PIPELINE_CACHE", demo_cache)
    notebook = execute("quickstart.ipynb", tmp_path)
    text, mimes = outputs(notebook)
    assert ALREADY_INSTALLED in text and "nothing to install" in text
    assert "cluster: cpu" in text
    assert "TensorSpec(shape=(128, 64, 64, 3)" in text
    assert "image/png" in mimes, "the batch of images was not shown"
    assert "input pipeline:" in text and "examples/s" in text
    assert "'steps': 4" in text and "eval_accuracy" in text
    assert (tmp_path / "runs" / "notebook" / "metrics.json").exists()
    if jax_installed():  # the last cell: the same demo on Keras 3 with JAX, in the same kernel
        assert "Keras 3 on JAX" in text and (tmp_path / "runs" / "notebook_jax" / "metrics.json").exists()


def test_pipeline_tuning_runs_the_doctor_and_shows_the_chart(tmp_path, monkeypatch, demo_cache):
    monkeypatch.setenv("TPU_PIPELINE_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TPU_PIPELINE_CACHE", demo_cache)
    notebook = execute("pipeline_tuning.ipynb", tmp_path)
    text, mimes = outputs(notebook)
    assert ALREADY_INSTALLED in text
    assert "the preprocessing map runs 1 call(s) at a time" in text and "data.num_parallel_calls=" in text
    assert "measured speed-up in this run" in text and "bottleneck:" in text
    assert "image/png" in mimes
    assert (tmp_path / "doctor_stages.png").exists()
    assert text.count("ceiling (a) compute-bound") == 2


def test_text_lm_converts_trains_and_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_NOTEBOOK_QUICK", "1")
    notebook = execute("text_lm.ipynb", tmp_path)
    text, _ = outputs(notebook)
    assert ALREADY_INSTALLED in text
    assert "400 documents" in text and "'type': 'bytes'" in text
    assert "'inputs_segment_ids': (16, 256)" in text and "(16, 256) (16, 256)" in text
    assert "'steps': 4" in text and "eval_bits_per_byte" in text and "tokens_per_sec" in text
    samples = [line for line in text.splitlines() if line.startswith(("'The ", "'A list ", "'def "))]
    assert len(samples) == 3, text[-3000:]
    assert (tmp_path / "data" / "corpus" / "metadata.json").exists()


# --- the install cell -----------------------------------------------------------------------------


def install_cell(name: str) -> str:
    notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code" and "TPU_PIPELINE_SOURCE" in cell.source]
    assert len(cells) == 1 and cells[0] is notebook.cells[1], f"{name}: the install cell must be the first code cell"
    return cells[0].source


def test_every_notebook_starts_with_the_same_install_cell_and_the_suite_runs_it():
    sources = {name: install_cell(name) for name in NOTEBOOKS}
    assert len(set(sources.values())) == 1, "the install cell differs between notebooks: copy one over the others"
    for name in NOTEBOOKS:
        notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
        assert "skip-execution" not in notebook.cells[1].metadata.get("tags", []), name  # here it must say so
        assert "Colab TPU runtime" in notebook.cells[0].source and "TPU_PIPELINE_SOURCE" in notebook.cells[0].source
        for cell in notebook.cells:  # no registry holds the package, and no placeholder URL stands in for it
            assert "<your-org>" not in cell.source and "pip install tpu-pipeline" not in cell.source, name
            assert "/work/" not in cell.source and "checkout" not in cell.source, name
    source = sources[NOTEBOOKS[0]]
    assert 'TPU_PIPELINE_SOURCE = ""' in source and source.rstrip().endswith(INSTALL_CALL)


@pytest.fixture
def cell(monkeypatch):
    """The install cell's functions, as the cell defines them (everything but its last line, the call)."""
    source = install_cell(NOTEBOOKS[0]).rstrip()
    namespace = {"__name__": "install_cell"}
    exec(compile(source[: -len(INSTALL_CALL)], "install_cell", "exec"), namespace)
    return namespace


def test_the_cell_pins_the_tpu_tensorflow_that_setup_env_installs(cell):
    setup_env = open(os.path.join(REPO, "scripts", "setup_env.sh")).read()
    assert cell["TPU_TENSORFLOW"] == f"tensorflow-tpu=={TESTED_TPU_TENSORFLOW}"
    assert cell["TPU_LIBTPU"] == f"libtpu=={TESTED_LIBTPU}"
    assert f'TPU_TENSORFLOW="{cell["TPU_TENSORFLOW"]}"' in setup_env and f'TPU_LIBTPU="{cell["TPU_LIBTPU"]}"' in setup_env
    minor = ".".join(TESTED_TPU_TENSORFLOW.split(".")[:2])
    assert cell["TPU_TF_KERAS"] == f"tf-keras~={minor}.0"


def test_where_installed_it_only_says_so(cell, capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    cell["install_tpu_pipeline"]("")  # no source needed: nothing happens
    out = capsys.readouterr().out.strip()
    assert out.startswith("tpu_pipeline ") and out.endswith(": nothing to install") and len(out.splitlines()) == 1


def test_a_tpu_runtime_is_seen_by_its_device_files_or_colabs_variables(cell, tmp_path):
    tpu_runtime, dev = cell["tpu_runtime"], tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (dev / "vfio" / "vfio").touch()  # the control node every VM with VFIO has: not a TPU
    assert tpu_runtime(str(dev), {}) is None
    assert tpu_runtime(str(dev), {"COLAB_TPU_1VM": ""}) is None  # Colab's CPU and GPU runtimes set it empty
    assert tpu_runtime(str(dev), {"COLAB_TPU_1VM": "1", "TPU_ACCELERATOR_TYPE": "v5e-1"}) == "Colab TPU runtime (v5e-1)"
    (dev / "vfio" / "0").touch()
    assert tpu_runtime(str(dev), {}) == f"TPU device {dev}/vfio/0"  # v5e and later
    (dev / "accel0").touch()
    assert tpu_runtime(str(dev), {}) == f"TPU device {dev}/accel0"  # v2-v4


def fake_repository(root, name="tpu_pipeline"):
    """The two files the cell checks, as this repository has them."""
    os.makedirs(os.path.join(root, "scripts"))
    shutil.copy(os.path.join(REPO, "scripts", "deps.py"), os.path.join(root, "scripts", "deps.py"))
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    setup["metadata"]["name"] = name
    with open(os.path.join(root, "setup.cfg"), "w") as handle:
        setup.write(handle)
    return root


def test_the_source_is_a_folder_an_archive_or_a_git_url_of_this_repository(cell, tmp_path):
    repository = cell["repository"]
    assert repository(REPO, str(tmp_path / "w0")) == REPO
    fake = fake_repository(str(tmp_path / "src" / "tpu_pipeline-main"))
    # GitHub's archives hold one folder (tpu_pipeline-main/): the cell looks inside it.
    with tarfile.open(tmp_path / "tpu_pipeline.tar.gz", "w:gz") as archive:
        archive.add(fake, arcname="tpu_pipeline-main")
    with zipfile.ZipFile(tmp_path / "tpu_pipeline.zip", "w") as archive:
        for folder, _, files in os.walk(fake):
            for file in files:
                archive.write(os.path.join(folder, file), os.path.relpath(os.path.join(folder, file), os.path.dirname(fake)))
    for number, archive in enumerate(["tpu_pipeline.tar.gz", "tpu_pipeline.zip"]):
        workdir = tmp_path / f"w{number + 1}"
        workdir.mkdir()
        found = repository(str(tmp_path / archive), str(workdir))
        assert found == str(workdir / "unpacked" / "tpu_pipeline-main") and os.path.isfile(os.path.join(found, "setup.cfg"))
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *command], cwd=fake, env=git, check=True)
    (tmp_path / "w3").mkdir()
    found = repository(f"file://{fake}", str(tmp_path / "w3"))
    assert found == str(tmp_path / "w3" / "tpu_pipeline") and os.path.isfile(os.path.join(found, "scripts", "deps.py"))


def test_a_missing_or_wrong_source_is_one_line_that_says_what_to_set(cell, tmp_path):
    repository = cell["repository"]
    for source, expected in [("", "tpu_pipeline is not installed: set TPU_PIPELINE_SOURCE at the top of this cell"),
                             (str(tmp_path / "nowhere"), "no such folder or .zip/.tar.gz file"),
                             (fake_repository(str(tmp_path / "other"), name="other"), "not a tpu_pipeline repository")]:
        with pytest.raises(SystemExit) as stop:
            repository(source, str(tmp_path))
        message = str(stop.value)
        assert expected in message and "\n" not in message and "TPU_PIPELINE_SOURCE" in message, message


def deps(extras: str) -> list[str]:
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "deps.py"), "--extras", extras],
                          capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.parametrize("tensorflow, first", [
    (None, []),                                                   # Colab's TPU runtimes carry no TensorFlow
    (("tensorflow", "2.21.0", False), [["uninstall", "tensorflow"]]),  # one without TPU kernels goes first
    (("tensorflow-tpu", "2.20.0", True), [["uninstall", "tensorflow-tpu"]]),  # 2.20 aborts with the libtpu it resolves
])
def test_on_a_tpu_runtime_the_cell_installs_the_tpu_tensorflow_and_exactly_one_tensorflow(cell, tensorflow, first):
    py, pip = sys.executable, [sys.executable, "-m", "pip", "install", "--quiet"]
    commands = cell["install_commands"](REPO, "TPU device /dev/vfio/0", tensorflow)
    uninstall = [[py, "-m", "pip", "uninstall", "--quiet", "-y", name] for _, name in first]
    tpu_tensorflow = f"tensorflow-tpu=={TESTED_TPU_TENSORFLOW}"
    assert commands == uninstall + [
        pip + [tpu_tensorflow, f"libtpu=={TESTED_LIBTPU}"],
        pip + ["--no-deps", cell["TPU_TF_KERAS"]],               # tf-keras requires `tensorflow`: not that
        pip + [tpu_tensorflow] + deps("notebook"),               # the rest, resolved with the TPU TensorFlow kept
        pip + ["--no-deps", REPO],
    ]
    rest = commands[-2][len(pip) + 1:]
    assert "google-crc32c>=1.5" in rest and not [r for r in rest if re.split(r"[<>=!~;\[ ]", r)[0] in ("tensorflow", "tf-keras")]


@pytest.mark.parametrize("tensorflow, keep, keras", [
    (("tensorflow", "2.18.0", True), "tensorflow==2.18.0", "tf-keras~=2.18.0"),   # a tpu-vm-tf-* image's own
    (("tensorflow-tpu", TESTED_TPU_TENSORFLOW, True), f"tensorflow-tpu=={TESTED_TPU_TENSORFLOW}", None),
])
def test_a_tpu_tensorflow_already_there_is_kept(cell, tensorflow, keep, keras):
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    commands = cell["install_commands"](REPO, "TPU device /dev/accel0", tensorflow)
    assert commands == [pip + ["--no-deps", keras or cell["TPU_TF_KERAS"]], pip + [keep] + deps("notebook"),
                        pip + ["--no-deps", REPO]]


def test_on_a_cpu_or_gpu_runtime_the_cell_keeps_its_tensorflow(cell):
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    assert cell["install_commands"](REPO, None, ("tensorflow", "2.19.0", False)) == [
        pip + ["tensorflow==2.19.0", f"{REPO}[notebook]"]]
    assert cell["install_commands"](REPO, None, None) == [pip + [f"{REPO}[notebook]"]]


def test_the_cell_installs_from_the_source_and_says_what_in_one_line(cell, capsys, monkeypatch, tmp_path):
    """The whole cell on a fresh Colab TPU runtime, pip left out (tests/test_notebooks.py has no network)."""
    ran, real_run = [], subprocess.run

    def run(command, **kwargs):
        if command[1:3] == ["-m", "pip"]:
            ran.append(command)
            return subprocess.CompletedProcess(command, 0, "", "")
        return real_run(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("COLAB_TPU_1VM", "1")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5e-1")
    cell["installed_package"] = lambda: None                   # a fresh runtime
    cell["tensorflow_installed"] = lambda ask_for_tpu_kernels: None
    fake = fake_repository(str(tmp_path / "copy"))
    cell["sys"] = types.SimpleNamespace(modules={}, executable=sys.executable)  # a fresh kernel: no TensorFlow yet
    cell["install_tpu_pipeline"](fake)
    assert ran[0][5:] == [f"tensorflow-tpu=={TESTED_TPU_TENSORFLOW}", f"libtpu=={TESTED_LIBTPU}"]
    assert ran[-1][-1] == fake and len(ran) == 4
    out = capsys.readouterr().out.strip()
    assert out.startswith("installed tpu_pipeline ") and f"from {fake} for the TPU (Colab TPU runtime (v5e-1))" in out
    # One line of what was installed, and on this v5e the path it chose (test below).
    assert len(out.splitlines()) == 2 and out.splitlines()[1].startswith("TPU v5e-1: this cell installed"), out
    cell["sys"] = sys  # TensorFlow imported before the cell (as in this process): it must be restarted
    cell["install_tpu_pipeline"](fake)
    assert capsys.readouterr().out.strip().splitlines()[2].startswith("TensorFlow was imported in this session")

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for libtpu==0.0.10")

    monkeypatch.setattr(subprocess, "run", failing)
    cell["install_commands"] = lambda *a: [[sys.executable, "-m", "pip", "install", "libtpu==0.0.10"]]
    with pytest.raises(SystemExit, match="pip install libtpu==0.0.10 failed:\nERROR: No matching distribution"):
        cell["install_tpu_pipeline"](fake)


def test_on_a_v5e_or_v6e_runtime_the_cell_says_which_path_it_installed_and_where_the_other_is(cell):
    """Issue 47 item 8: on Colab's v5e-1 and v6e-1 runtimes the cell installed the TPU TensorFlow without a word,
    though Cloud's guides for those TPUs use JAX. It now says which path it chose and where the JAX path is."""
    for kind in ("v6e-1", "v5e-1", "v5litepod-8"):
        note = cell["path_note"]("Colab TPU runtime", {"TPU_ACCELERATOR_TYPE": kind})
        assert note.startswith(f"TPU {kind}: this cell installed the TensorFlow path"), note
        assert "model.framework=jax" in note and "docs/tpu.md#which-backend" in note, note
    assert cell["path_note"]("Colab TPU runtime", {"TPU_ACCELERATOR_TYPE": "v2-8"}) is None  # TensorFlow's own
    assert cell["path_note"](None, {"TPU_ACCELERATOR_TYPE": "v6e-1"}) is None  # no TPU: nothing installed for one


def test_every_notebook_quiets_tensorflows_native_info_lines_before_importing_it():
    """Issue 47 item 7: the notebooks showed TensorFlow's C++ INFO lines (buffer sizes, oneDNN), which the CLI hides.
    The first cell after the install sets TF_CPP_MIN_LOG_LEVEL=2 as the CLI does, before anything imports
    TensorFlow (a user's own setting stays)."""
    for name in NOTEBOOKS:
        notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
        code = [cell.source for cell in notebook.cells if cell.cell_type == "code"][1:]  # after the install cell
        setting = 'os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")'
        assert setting in code[0] and code[0].index(setting) < code[0].index("from tpu_pipeline"), name
