"""Each task is one object (issue 26): the names once, one vocabulary order for verify and train, and a new
task is one new module.

The config layer holds the names (`config.tasks.TASKS`) and what it needs of a task; the model layer holds
one `Task` object per name (`model.tasks`), which decides the logits' shape, causal attention, the loss and
metrics and what `train` reports. `format.vocabulary` holds the order in which a vocabulary is chosen, and
both `train` (the model's size) and `verify` (the ids' bound) call it.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.config.tasks import TASKS, predicts_tokens
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.info import DatasetInfo
from tpu_pipeline.format.metadata import shard_name, write_metadata
from tpu_pipeline.format.vocabulary import checked_vocabulary, model_vocabulary, Vocabulary
from tpu_pipeline.model import build_model, tf_keras
from tpu_pipeline.model import tasks
from tpu_pipeline.train.runner import num_classes
from tpu_pipeline.verify import config_vocabulary, verify_data

pytestmark = pytest.mark.tf_builds

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tpu_pipeline")
TOKENIZER = 259  # the dataset's tokenizer (byte-level), ids 0..258


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_CACHE", str(tmp_path / "cache"))


def _sources() -> dict[str, str]:
    found = {}
    for root, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                found[os.path.relpath(path, PACKAGE)] = open(path, encoding="utf-8").read()
    return found


def test_the_task_names_are_defined_once_and_the_registry_has_one_object_each():
    assignments = [path for path, text in _sources().items() if re.search(r"^\s*TASKS\b\s*(:[^=]*)?=", text, re.M)]
    assert assignments == [os.path.join("config", "tasks.py")], assignments
    assert tasks.registered() == TASKS
    for name in TASKS:
        task = tasks.task_named(name)
        assert task.name == name and task.predicts_tokens == predicts_tokens(name)
    with pytest.raises(ConfigError, match=r"train\.task: 'translation' is not one of classification, language_model"):
        tasks.task_named("translation")


def test_the_model_and_report_modules_ask_the_task_instead_of_comparing_its_name():
    compared = re.compile(r"""task\s*[!=]=\s*["']|["'](classification|language_model)["']\s*[!=]=""")
    modules = ["model/builder.py", "model/architectures.py", "model/transformer.py", "train/callbacks.py",
               "config/data.py", "pipeline/checks/record_check.py", "train/model_inputs.py", "train/runner.py"]
    sources = _sources()
    offenders = [m for m in modules if compared.search(sources[os.path.join(*m.split("/"))])]
    assert not offenders, offenders


# --- one vocabulary, one order ---------------------------------------------------------------------

def test_the_order_is_embedding_then_logits_then_tokenizer():
    tokenizer = Vocabulary(TOKENIZER, "metadata.json tokenizer")
    assert model_vocabulary(300, None, True, tokenizer) == Vocabulary(300, "model.transformer.vocab_size")
    assert model_vocabulary(None, 300, True, tokenizer) == Vocabulary(300, "train.num_classes")
    assert model_vocabulary(None, 300, False, tokenizer) == tokenizer  # a class count is no vocabulary
    assert model_vocabulary(None, None, True, None) is None
    # verify holds a file to its tokenizer too, where that is the smaller bound
    assert checked_vocabulary(Vocabulary(384, "model.transformer.vocab_size"), tokenizer) == tokenizer
    assert checked_vocabulary(Vocabulary(200, "model.transformer.vocab_size"), tokenizer).size == 200


def test_a_language_model_with_two_vocabularies_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"^train\.num_classes=300 and model\.transformer\.vocab_size=259: a language "
                                          r"model's targets are its input token ids"):
        config_from_dict({"train": {"task": "language_model", "num_classes": 300},
                          "model": {"transformer": {"vocab_size": 259}}})
    # a classifier's classes and its token vocabulary are two things
    config = config_from_dict({"train": {"num_classes": 3}, "model": {"transformer": {"vocab_size": 259}}})
    assert config_vocabulary(config) == Vocabulary(259, "model.transformer.vocab_size")


def _token_dataset(directory: str, tokenizer: bool) -> None:
    """One shard of documents using every id 0..258, with metadata.json (and its tokenizer when asked)."""
    os.makedirs(directory)
    name = shard_name("train", 0, 1)
    rows = [list(range(start, min(start + 50, TOKENIZER))) for start in range(0, TOKENIZER, 50)]
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
        for row in rows:
            ids = tf.train.Feature(int64_list=tf.train.Int64List(value=row))
            writer.write(tf.train.Example(features=tf.train.Features(feature={"tokens": ids})).SerializeToString())
    metadata = {"format_version": 1, "name": "tokens", "source": {"type": "text"}, "class_names": None,
                "features": {"tokens": {"dtype": "int64", "kind": "ragged"}}, "compression": "",
                "splits": {"train": {"files": [name], "counts": [len(rows)], "num_examples": len(rows),
                                     "num_skipped": 0, "skipped": []}}}
    if tokenizer:
        metadata["tokenizer"] = {"type": "bytes", "vocab_size": TOKENIZER, "offset": 3, "special_ids": {}}
    write_metadata(directory, metadata)


@pytest.mark.parametrize("tokenizer", [True, False], ids=["tokenizer", "no-tokenizer"])
@pytest.mark.parametrize("vocab_size, classes", [(None, None), (384, None), (None, 384), (384, 384), (200, None),
                                                 (None, 200)])
def test_verify_and_train_agree_on_the_vocabulary(tmp_path, tokenizer, vocab_size, classes):
    """train sizes the model with `model_vocabulary`; verify bounds each file's ids by the same vocabulary (and
    by the file's own tokenizer where smaller): an id verify passes always fits the model, and an id the model
    cannot take (past a vocab_size of 200) is a fault verify names with the key to change."""
    directory = str(tmp_path / "data")
    _token_dataset(directory, tokenizer)
    config = config_from_dict({
        "data": {"source": {"type": "tfrecord", "dir": directory, "split": "train"}, "batch_size": 1, "outputs": None},
        "train": {"task": "language_model", **({"num_classes": classes} if classes else {})},
        "model": {"architecture": "transformer", "transformer": {"vocab_size": vocab_size}},
    })
    info = DatasetInfo(None, None, {}, {"vocab_size": TOKENIZER} if tokenizer else None)
    pipeline = SimpleNamespace(source=SimpleNamespace(info=lambda: info))
    report = verify_data(config.data, progress=False, vocab=config_vocabulary(config))
    trained = None
    if vocab_size or classes or tokenizer:
        trained = num_classes(config, pipeline)
        origin = ("model.transformer.vocab_size" if vocab_size else "train.num_classes" if classes
                  else "metadata.json tokenizer")
        assert trained == (vocab_size or classes or TOKENIZER)
        bound = min(trained, TOKENIZER) if tokenizer else trained
        if tokenizer and TOKENIZER <= trained:
            origin = "metadata.json tokenizer"
        assert report.notes == [f"token ids of 'tokens' checked against vocab_size {bound} ({origin})"], report.notes
        past = [f for f in report.faults if f.kind == "token_out_of_vocab"]
        assert bool(past) == (bound < TOKENIZER), report.table()  # the data holds every id below 259
    else:
        with pytest.raises(ConfigError, match="the vocabulary size is unknown"):
            num_classes(config, pipeline)
        assert report.notes[0].startswith("token ids of 'tokens' not checked against a vocabulary")


# --- the figures a task reports ----------------------------------------------------------------------

def test_a_language_models_loss_is_its_weighted_cross_entropy_and_a_classifiers_stays_keras():
    logs = {"loss": 4.17, "token_accuracy": 0.3, "cross_entropy": 5.56, "val_loss": 4.0, "val_cross_entropy": 5.0}
    assert tasks.task_named("language_model").reported(logs) == {"loss": 5.56, "token_accuracy": 0.3, "val_loss": 5.0}
    logs = {"loss": 0.7, "accuracy": 0.5, "cross_entropy": 0.69, "val_loss": 0.8, "val_cross_entropy": 0.75}
    assert tasks.task_named("classification").reported(logs) == {"loss": 0.7, "accuracy": 0.5, "val_loss": 0.75}
    evaluation = {"loss": 1.0, "cross_entropy": 1.5, "token_accuracy": 0.25, "perplexity": 4.48}
    assert tasks.task_named("language_model").evaluation_figures(evaluation) == {
        "eval_loss": 1.5, "eval_token_accuracy": 0.25, "eval_perplexity": 4.48}


def test_the_figures_come_in_one_order_whichever_keras_logged_them():
    """Issue 47 item 7: Keras 3 on JAX logs its metrics alphabetically, tf_keras the loss first, so the same run's
    epoch lines read differently on the two frameworks. The task's own figures come first, the loss leading."""
    jax_order = {"bits_per_byte": 1.0, "cross_entropy": 2.0, "loss": 3.0, "perplexity": 4.0, "token_accuracy": 0.5,
                 "val_bits_per_byte": 1.1, "val_cross_entropy": 2.1, "val_loss": 3.1, "val_perplexity": 4.1,
                 "val_token_accuracy": 0.6}
    tf_order = dict(sorted(jax_order.items(), key=lambda item: item[0] not in ("loss", "val_loss")))
    language_model = tasks.task_named("language_model")
    for logs in (jax_order, tf_order):
        assert list(language_model.reported(logs)) == [
            "loss", "token_accuracy", "perplexity", "bits_per_byte",
            "val_loss", "val_token_accuracy", "val_perplexity", "val_bits_per_byte"]
    assert list(tasks.task_named("classification").reported(
        {"accuracy": 0.5, "loss": 0.7, "val_accuracy": 0.4, "val_loss": 0.8, "zeta": 1.0})) == [
        "loss", "accuracy", "zeta", "val_loss", "val_accuracy"]


# --- a new task is one new module ----------------------------------------------------------------------

TOY_TASK = '''
"""A toy task: a classifier that reports its top-2 accuracy."""
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.tasks import Task, register


class TopTwo(Task):
    name = "top_two"

    def check_logits_width(self, num_classes):
        if num_classes < 3:
            raise ConfigError(f"num_classes: top-2 needs at least 3 classes, got {num_classes}")

    def loss_and_metrics(self, keras, config, byte_offset=None):
        return (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                [keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top_two"),
                 keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy")])

    def trained_figures(self, history):
        return ["loss", "top_two"]


register(TopTwo())
'''


def test_a_new_task_is_one_module(tmp_path, monkeypatch):
    (tmp_path / "toy_task.py").write_text(textwrap.dedent(TOY_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))  # the toy registers into a copy
    monkeypatch.delitem(sys.modules, "toy_task", raising=False)
    importlib.import_module("toy_task")
    config = ModelConfig.from_dict({"architecture": "mlp", "mlp": {"hidden_units": [8]}})
    build = dict(strategy=tf.distribute.get_strategy(), kind="cpu", input_shape=[4], steps_per_epoch=1, epochs=1)
    with pytest.raises(ConfigError, match="top-2 needs at least 3 classes, got 2"):
        build_model(config, num_classes=2, task="top_two", **build)
    model = build_model(config, num_classes=3, task="top_two", **build)
    rng = np.random.default_rng(0)
    logs = model.fit(rng.normal(size=(8, 4)).astype("float32"), rng.integers(0, 3, 8), batch_size=4, epochs=1,
                     verbose=0).history
    task = tasks.task_named("top_two")
    assert set(task.reported({k: v[-1] for k, v in logs.items()})) == {"loss", "top_two"}
    assert isinstance(model, tf_keras.Model)
