"""Notebooks run top to bottom on CPU (small step counts), as a Colab user would run them."""
from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    assert "cluster: cpu" in text
    assert "TensorSpec(shape=(128, 64, 64, 3)" in text
    assert "image/png" in mimes, "the batch of images was not shown"
    assert "input pipeline:" in text and "examples/s" in text
    assert "'steps': 4" in text and "eval_accuracy" in text
    assert (tmp_path / "runs" / "notebook" / "metrics.json").exists()


def test_pipeline_tuning_runs_the_doctor_and_shows_the_chart(tmp_path, monkeypatch, demo_cache):
    monkeypatch.setenv("TPU_PIPELINE_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TPU_PIPELINE_CACHE", demo_cache)
    notebook = execute("pipeline_tuning.ipynb", tmp_path)
    text, mimes = outputs(notebook)
    assert "the preprocessing map runs 1 call(s) at a time" in text and "data.num_parallel_calls=" in text
    assert "measured speed-up in this run" in text and "bottleneck:" in text
    assert "image/png" in mimes
    assert (tmp_path / "doctor_stages.png").exists()
    assert text.count("ceiling (a) compute-bound") == 2


def test_text_lm_converts_trains_and_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_NOTEBOOK_QUICK", "1")
    notebook = execute("text_lm.ipynb", tmp_path)
    text, _ = outputs(notebook)
    assert "400 documents" in text and "'type': 'bytes'" in text
    assert "'inputs_segment_ids': (16, 256)" in text and "(16, 256) (16, 256)" in text
    assert "'steps': 4" in text and "eval_bits_per_byte" in text and "tokens_per_sec" in text
    samples = [line for line in text.splitlines() if line.startswith(("'The ", "'A list ", "'def "))]
    assert len(samples) == 3, text[-3000:]
    assert (tmp_path / "data" / "corpus" / "metadata.json").exists()


def test_each_notebook_installs_the_package_by_name_in_a_cell_the_suite_skips():
    for name in ("quickstart.ipynb", "pipeline_tuning.ipynb", "text_lm.ipynb"):
        notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
        install = [cell for cell in notebook.cells if cell.cell_type == "code" and "PACKAGE_SPEC" in cell.source]
        assert len(install) == 1, name
        assert 'PACKAGE_SPEC = "tpu-pipeline"' in install[0].source and "git+https://" in install[0].source
        assert install[0].metadata.get("tags") == ["skip-execution"]  # nbclient skips it; Colab runs it
        assert "Colab TPU runtime" in notebook.cells[0].source
        assert not any("/work/" in cell.source or "checkout" in cell.source for cell in notebook.cells), name

