"""The training job: cluster → pipelines → model → fit with checkpoints → eval → metrics.json.

The only layer that ties the others together. Resumes from the newest checkpoint in
`train.run_dir`: model, optimizer (its step counter is the learning-rate schedule's step and the
input position), and the history of finished epochs. The input pipelines are rebuilt at that
step (`Pipeline.build(start=...)`): the rest of the interrupted epoch is exactly the examples not
yet delivered, and later epochs are what they would have been.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from typing import Any, Callable, Optional, Union

import tensorflow as tf
from absl import logging

from tpu_pipeline.cluster import ClusterInfo, resolve
from tpu_pipeline.cluster.coordination import CoordinationService, KeyValueStore, StoreUnavailable
from tpu_pipeline.config import Config
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.errors import ClusterError, ConfigError
from tpu_pipeline.format.vocabulary import model_vocabulary, tokenizer_vocabulary
from tpu_pipeline.model import build_model, tf_keras
from tpu_pipeline.model.tasks import task_named
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.data_errors import DATA_ERRORS as _DATA_ERRORS, named_data_error
from tpu_pipeline.pipeline.efficiency import TokenMeter, sequence_keys
from tpu_pipeline.pipeline.position_log import PositionLog
from tpu_pipeline.pipeline.sequence import Bucket
from tpu_pipeline.pipeline.stages import ToOutputs
from tpu_pipeline.pipeline.wait_meter import InputWaitMeter, metered
from tpu_pipeline.pipeline.record_check import config_vocabulary, tf_message
from tpu_pipeline.train.cadence import TimedCheckpointer, cadence
from tpu_pipeline.train.callbacks import ProgressLogger, TrainState
from tpu_pipeline.train.preemption import PreemptionFlag, StopAgreement
from tpu_pipeline.train.run_files import RunFiles, check_same_restore, metrics_path, read_metrics

# What a collective raises when a peer worker died or hung up.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.InternalError, tf.errors.AbortedError,
                tf.errors.DeadlineExceededError, tf.errors.CancelledError)
_RUN_KEYS = itertools.count()  # names this process's train() calls alike on every worker
POSITION_KEY = "data"  # a windowed pipeline's input positions in the checkpoint (WindowedPosition)
# How long a save waits for every worker's input position: all save the same step, so a step's skew
# at most, unless a peer is gone.
POSITION_WAIT_SECONDS = 120.0

Printer = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


def full_batches(pipeline: Pipeline, batch_size: int, section: str, steps_key: str) -> int:
    """Full global batches in one pass (what drop_remainder delivers); an empty pass is an error."""
    examples = pipeline.source.count_examples()
    if examples is None:
        raise ConfigError(f"{steps_key}: the {section} source cannot tell its size; set {steps_key} explicitly")
    steps = examples // batch_size
    if steps == 0:
        raise ConfigError(f"{section}.batch_size={batch_size} is larger than its {examples} examples; lower it")
    return steps


def num_classes(config: Config, pipeline: Pipeline) -> int:
    """train.num_classes, else the number of class names the source knows (a dataset's metadata); for a
    task that predicts tokens, the vocabulary (`format.vocabulary.model_vocabulary`, the order `verify` uses):
    model.transformer.vocab_size, train.num_classes, or the tokenizer's."""
    if predicts_tokens(config.train.task):
        vocab = model_vocabulary(config.model.transformer.vocab_size, config.train.num_classes, True,
                                 tokenizer_vocabulary({"tokenizer": pipeline.source.info().tokenizer}))
        if vocab is None:
            raise ConfigError(
                "train.task=language_model: the vocabulary size is unknown; convert the text with "
                "`tpu-pipeline convert --from text` (its metadata.json says it), or set model.transformer.vocab_size"
            )
        return vocab.size
    known = config.train.num_classes or pipeline.source.info().num_classes
    if known is None:
        raise ConfigError(
            "train.num_classes: not set, and the data has no metadata with class names "
            "(use data.source.dir with a converted dataset, or set train.num_classes)"
        )
    return known


def _training_data(config: Config) -> DataConfig:
    """Training needs an endless stream (Keras counts epochs by steps_per_epoch)."""
    if config.data.repeat != "forever":
        logging.info("data.repeat=%s: training repeats the data forever; epochs are train.steps_per_epoch long", config.data.repeat)
        return config.data.model_copy(update={"repeat": "forever"})
    return config.data


_RAGGED = ("data.outputs.inputs: its examples vary in length (a ragged feature), and a model needs static shapes: "
           "add data.sequence: {keys: [...], length: 1024, mode: pack} (or pad, bucket) to pad, bucket or pack them")


def _element_shape(pipeline: Pipeline, task: str = "classification") -> Union[list[int], dict[str, list[int]]]:
    """The model's input shape(s) per example: one list, or a dict by input name (token ids with their
    segment ids and positions); refuses what a model cannot take, in one line naming data.outputs."""
    spec = pipeline.build().element_spec
    if not isinstance(spec, tuple):
        if task == "language_model":
            raise ConfigError("data.outputs: a language model trains on (inputs, targets) token pairs: add {op: lm_shift, "
                              "key: tokens} to data.preprocess and set data.sequence.keys: [inputs, targets] (the "
                              "outputs follow from them), or set data.outputs {inputs: ..., targets: ..., weights: ...}")
        raise ConfigError("data.outputs: training needs (inputs, targets); set data.outputs {inputs: ..., targets: ...}")
    if task == "language_model":
        _check_language_model_outputs(spec, pipeline)
    inputs = spec[0]
    named = inputs if isinstance(inputs, dict) else {"": inputs}
    shapes = {}
    for name, leaf in named.items():
        if isinstance(leaf, tf.RaggedTensorSpec):
            raise ConfigError(_RAGGED)
        if not isinstance(leaf, tf.TensorSpec):
            raise ConfigError(f"data.outputs.inputs: {name or 'the input'} is a {type(leaf).__name__}; a model takes tensors")
        shape = leaf.shape.as_list()[1:]
        bucket_length = isinstance(pipeline.windowed, Bucket) and len(shape) == 1
        if any(size is None for size in shape) and not bucket_length:  # a bucket's length: one compile per bucket
            raise ConfigError(
                f"data.outputs.inputs: its examples have shape {shape}, which varies (None); a model needs one fixed "
                "size: set data.image_size: [height, width] for a converted image folder, or add "
                "{op: resize, key: image, size: [height, width]} to data.preprocess"
            )
        shapes[name] = shape
    return shapes if isinstance(inputs, dict) else shapes[""]


def _check_eval_feeds_the_model(config: Config, trained: Union[list[int], dict[str, list[int]]],
                                eval_pipeline: Pipeline) -> None:
    """Refuses, before the first step, an evaluation whose inputs the model built for `data` cannot take
    (other input names, or another fixed length), in one line naming the keys that differ."""
    spec = eval_pipeline.build().element_spec
    if not isinstance(spec, tuple):
        return  # no targets: for_evaluation says so
    inputs = spec[0] if isinstance(spec[0], dict) else {"": spec[0]}
    given = {name: leaf.shape.as_list()[1:] for name, leaf in inputs.items() if getattr(leaf, "shape", None) is not None}
    wanted = trained if isinstance(trained, dict) else {"": trained}
    data_sequence, eval_sequence = config.data.sequence, config.eval_data.sequence
    if set(given) != set(wanted):
        raise ConfigError(
            f"eval_data.outputs.inputs: evaluation gives the inputs {sorted(given)}, and the model trained on data takes "
            f"{sorted(wanted)}; leave eval_data.outputs and eval_data.sequence.mode out (they follow data's) or make "
            "them the same as data's"
        )
    for name, shape in wanted.items():
        if len(given[name]) == len(shape) and all(w is None or g == w for g, w in zip(given[name], shape)):
            continue
        where = f"its input {name!r}" if name else "its input"
        if data_sequence is not None and eval_sequence is not None and data_sequence.lengths() != eval_sequence.lengths():
            raise ConfigError(
                f"eval_data.sequence.length={eval_sequence.length}: the model trained on data.sequence.length="
                f"{data_sequence.length} takes {where} of shape {shape}, not {given[name]}; remove "
                "eval_data.sequence.length (it follows data.sequence.length) or make the two equal"
            )
        raise ConfigError(
            f"eval_data: {where} has shape {given[name]} per example, and the model trained on data takes {shape}; "
            "make eval_data's preprocessing give the same shape as data's"
        )


def _check_language_model_outputs(spec: tuple, pipeline: Pipeline) -> None:
    """A language model needs a target token per input position and weights that leave padding out."""
    targets = spec[1]
    if isinstance(targets, tf.RaggedTensorSpec):
        raise ConfigError(_RAGGED)
    if not isinstance(targets, tf.TensorSpec) or targets.shape.rank != 2 or not targets.dtype.is_integer:
        raise ConfigError(
            f"data.outputs.targets: train.task=language_model predicts a token id per position, so the targets must be "
            f"[batch, length] integer ids, not {targets}; shift the tokens with {{op: lm_shift, key: tokens}} and set "
            "data.outputs.targets: targets"
        )
    if len(spec) < 3 and pipeline.plan is not None and pipeline.plan.sequence.value is not None:
        weights = "targets_segment_ids" if pipeline.plan.sequence.value.mode == "pack" else "targets_mask"
        raise ConfigError(
            f"data.outputs.weights: padded token rows need per-token weights, or the loss and metrics count the "
            f"padding; set data.outputs.weights: {weights}"
        )


class Preempted(SystemExit):
    """Training stopped on SIGTERM after saving a checkpoint; exit code 143 (128 + SIGTERM) tells a
    scheduler the job did not finish and should be started again."""

    def __init__(self) -> None:
        super().__init__(143)


def train(config: Config, *, cluster: Optional[ClusterInfo] = None, printer: Printer = _print,
          model_fn: Optional[Callable[..., Any]] = None) -> dict[str, Any]:
    """Runs (or resumes) training and evaluation; returns what it writes to run_dir/metrics.json.

    `model_fn(input_shape=[...], num_classes=N)`: your uncompiled Keras model (logits), built inside
    the strategy's scope and compiled here; it replaces config.model's network."""
    if config.data is None:
        raise ConfigError("the config has no 'data' section: training needs one (and usually eval_data)")
    cluster = cluster or resolve(config.cluster)
    if not cluster.is_chief:
        printer = _worker_printer(printer, cluster.worker_id)
    printer(cluster.describe())
    saves = cadence(config.train, cluster.num_workers)
    if saves.note:
        printer(saves.note)
    if config.train.seed is not None:
        tf_keras.utils.set_random_seed(config.train.seed)
    run_dir = config.train.run_dir
    tf.io.gfile.makedirs(run_dir)
    run_key = f"run{next(_RUN_KEYS)}"
    store = CoordinationService() if cluster.num_workers > 1 else None

    train_data = _training_data(config)
    target = "tpu" if cluster.kind == "tpu" else "cpu"
    train_pipeline = Pipeline.from_config(train_data, target=target, num_classes=config.train.num_classes,
                                          vocab=config_vocabulary(config))
    input_shape = _element_shape(train_pipeline, config.train.task)
    steps = config.train.steps_per_epoch or full_batches(train_pipeline, config.data.batch_size, "data", "train.steps_per_epoch")
    epochs = config.train.epochs
    meter = InputWaitMeter()

    train_pipeline, tokens = _with_token_meter(train_pipeline)
    windowed = train_pipeline.windowed
    # Through data.service no host sees the stream's windows (the service decides which worker makes
    # which row), so there a windowed stream restarts as an image stream does, at a data epoch's start.
    position = (WindowedPosition(train_pipeline, cluster, store, run_key)
                if windowed is not None and train_pipeline.service is None else None)
    resumed_from = 0

    def train_dataset(step: int) -> Any:
        """The distributed training stream from global step `step` on (its input position)."""
        if position is not None:
            return cluster.strategy.distribute_datasets_from_function(
                lambda context: metered(position.stream(context, step), meter))
        if windowed is not None and train_pipeline.service is not None:
            return cluster.strategy.distribute_datasets_from_function(
                lambda context: metered(_windowed_service_stream(train_pipeline, context, step - resumed_from), meter))
        return cluster.strategy.distribute_datasets_from_function(
            lambda context: metered(train_pipeline.build(context, start=step * train_pipeline.examples_per_step(context)), meter)
        )

    eval_dataset, validation_steps, eval_pipeline = None, None, None
    if config.eval_data is not None:
        eval_pipeline = Pipeline.from_config(config.eval_data, target=target, prefix="eval_data",
                                             num_classes=config.train.num_classes, vocab=config_vocabulary(config))
        _check_eval_feeds_the_model(config, input_shape, eval_pipeline)
        # Exact: every example of one pass once, the last batch padded with zero-weight examples.
        eval_pipeline = eval_pipeline.for_evaluation()
        eval_dataset = eval_pipeline.distribute(cluster.strategy)
        validation_steps = config.train.eval_steps or eval_pipeline.evaluation_steps(cluster.num_replicas, cluster.num_hosts)

    model = _model_for(config, cluster, train_pipeline, input_shape, steps, model_fn)
    state = TrainState(task_named(config.train.task))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=state.epoch, history=state.history_json,
                                     **({POSITION_KEY: position} if position is not None else {}))
    files = RunFiles(run_dir, cluster, checkpoint, config.train.max_checkpoints)
    latest = files.latest_checkpoint
    if store is not None:
        check_same_restore(store, cluster, run_key, latest)
    total_steps = steps * epochs
    if latest:
        if position is not None:
            position.check_saved(latest)
        restored = checkpoint.restore(latest)
        resumed_from = int(model.optimizer.iterations.numpy())
        finished = read_metrics(run_dir) if resumed_from >= total_steps else None
        if finished is not None:
            # Nothing to train: the optimizer's slots are never built, so their saved values stay
            # unmatched on purpose (without this, TF warns once per slot at exit).
            restored.expect_partial()
            printer(f"run already complete: {int(state.epoch.numpy())} of {epochs} epoch(s), step {resumed_from} "
                    f"({latest}); nothing changed. Its metrics: {metrics_path(run_dir)}")
            return finished
        epoch_now, into = divmod(resumed_from, steps)
        if position is not None:
            where = position.describe()
        elif train_pipeline.service is None:
            where = (f"the input pipelines continue from example {resumed_from * config.data.batch_size:,} "
                     "of the training stream")
        elif windowed is not None:
            where = (f"data.service cannot resume a data.sequence {train_pipeline.plan.sequence.value.mode} stream "
                     "exactly (a step does not say how many examples its rows held), so the input starts a fresh "
                     f"service job at the start of the data (data epoch 1): what the {resumed_from:,} step(s) "
                     "before trained on comes again")
        else:
            data_epoch, again = train_pipeline.service_restart(resumed_from * config.data.batch_size)
            where = (f"data.service cannot resume exactly, so the input starts a fresh service job at the start of "
                     f"data epoch {data_epoch + 1}" + (f": {again:,} examples of it come again" if again else ""))
        printer(f"resumed from {latest}: step {resumed_from} (epoch {epoch_now + 1}, step {into} of {steps}); {where}")

    progress = ProgressLogger(config.data.batch_size, config.train.log_every_steps, meter, total_steps, printer, epochs,
                              tokens=tokens, task=state.task)
    agreement = StopAgreement(store, cluster.worker_id, cluster.num_workers, run_key) if store is not None else None
    with PreemptionFlag(agreement) as preemption:
        checkpointer = TimedCheckpointer(files, state, steps, plan=saves, preemption=preemption, printer=printer,
                                         before_save=position.record if position is not None else None)
        callbacks: list[Any] = [progress, checkpointer]
        if config.train.tensorboard:
            profile = tuple(config.train.profile_steps) if config.train.profile_steps else 0
            callbacks.append(tf_keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard"), profile_batch=profile))
        started = time.perf_counter()
        step = resumed_from
        if step < total_steps:
            printer(f"training {epochs - step // steps} epoch(s) of {steps} steps, global batch {config.data.batch_size}; "
                    + saves.describe())
            if train_pipeline.service is not None:
                split = train_pipeline.service
                printer(f"input: tf.data service {split.address} ({split.mode}{', job ' + split.job_name if split.job_name else ''}"
                        "): its workers make the batches, this host prefetches them")
        while step < total_steps and checkpointer.preempted_at is None:
            # A resumed epoch runs only its remaining steps, then whole epochs follow: Keras counts
            # steps per epoch, so the two parts are two fit calls, each on the stream from its step.
            epoch_now, into = divmod(step, steps)
            last_epoch = epoch_now + 1 if into else epochs
            try:
                model.fit(
                    train_dataset(step), epochs=last_epoch, initial_epoch=epoch_now, steps_per_epoch=steps - into,
                    validation_data=eval_dataset, validation_steps=validation_steps,
                    validation_freq=config.train.eval_every_epochs, callbacks=callbacks, verbose=0,
                )
            except _DATA_ERRORS as error:
                raise _explained(config, error) from None
            except _PEER_ERRORS as error:
                if cluster.num_workers == 1:
                    raise
                raise ClusterError(
                    f"a peer worker stopped or cannot be reached ({_peer_failure(error)}); start every worker again "
                    f"with the same command: the run resumes from {files.latest_checkpoint or 'its start (no checkpoint yet)'}"
                ) from None
            step = int(model.optimizer.iterations.numpy())
        train_seconds = time.perf_counter() - started
    if checkpointer.preempted_at is not None:
        printer(f"stopped by SIGTERM at step {checkpointer.preempted_at} of {total_steps}; the checkpoint is saved: "
                "start the same command again to resume")
        sys.stdout.flush()
        raise Preempted()

    history = state.history()
    metrics: dict[str, Any] = {
        "steps": int(model.optimizer.iterations.numpy()),
        "epochs": epochs,
        "steps_per_epoch": steps,
        "global_batch_size": config.data.batch_size,
        "resumed_from_step": resumed_from,
        **{name: history[name][-1] if history.get(name) else None for name in state.task.trained_figures(history)},
        # Token data: a batch's rows hold as many examples as fit (pack), so the rate is of rows, and
        # real tokens/s is the figure to read.
        ("examples_per_sec" if tokens is None else "rows_per_sec"): progress.examples_per_second(),
        **({"tokens_per_sec": progress.tokens_per_second(), "non_padding_fraction": tokens.fraction()}
           if tokens is not None else {}),
        "input_wait_fraction": progress.input_wait_fraction(),
        "train_seconds": train_seconds,
        # Seconds of train_seconds spent saving checkpoints, and those of the saves between epoch ends.
        "checkpoint_seconds": checkpointer.save_seconds,
        "step_checkpoint_seconds": checkpointer.periodic_seconds,
        "cluster": {"kind": cluster.kind, "replicas": cluster.num_replicas, "hosts": cluster.num_hosts},
        "history": history,
    }
    skipped = {p.skipped.section: p.skipped.as_dict() for p in (train_pipeline, eval_pipeline) if p and p.skipped}
    if skipped:
        metrics["skipped"] = skipped  # data.on_error=skip: records left out, by kind and file
        printer("data.on_error=skip left out " + ", ".join(
            f"{part['skipped']:,} of {part['records']:,} records in {section}" for section, part in skipped.items()
        ) + f" (by kind and file: 'skipped' in {metrics_path(run_dir)})")
    if eval_dataset is not None:
        try:
            evaluation = model.evaluate(eval_dataset, steps=validation_steps, verbose=0, return_dict=True)
        except _DATA_ERRORS as error:
            raise _explained(config, error) from None
        metrics.update(state.task.evaluation_figures(evaluation))  # eval_loss: the weighted cross-entropy
        metrics["eval_examples"] = None if config.train.eval_steps else eval_pipeline.source.count_examples()
    files.write_metrics(metrics)
    printer("final: " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items() if k not in ("cluster", "history", "skipped")
    ))
    if cluster.is_chief:
        where = [f"metrics {metrics_path(run_dir)}", f"checkpoints {files.checkpoint_dir}"]
        if config.train.tensorboard:
            where.append(f"TensorBoard logs {os.path.join(run_dir, 'tensorboard')} (tensorboard --logdir {run_dir})")
        printer("wrote " + "; ".join(where))
    return metrics


def _model_for(config: Config, cluster: ClusterInfo, pipeline: Pipeline, input_shape: Any, steps_per_epoch: int,
               model_fn: Optional[Callable[..., Any]]) -> Any:
    """The compiled model of this config for this pipeline's inputs: what `train` trains and `load_model` restores."""
    return build_model(
        config.model, strategy=cluster.strategy, kind=cluster.kind, input_shape=input_shape,
        num_classes=num_classes(config, pipeline), steps_per_epoch=steps_per_epoch, epochs=config.train.epochs,
        model_fn=model_fn, task=config.train.task,
        byte_offset=pipeline.source.info().byte_offset,  # a task that counts bytes (bits_per_byte) takes it
    )


def load_model(config: Config, *, cluster: Optional[ClusterInfo] = None,
               model_fn: Optional[Callable[..., Any]] = None) -> Any:
    """The model `train` built for this config, with the weights of the newest checkpoint in train.run_dir
    (to evaluate it, sample from it or export it); a ConfigError when the run has no checkpoint yet."""
    if config.data is None:
        raise ConfigError("the config has no 'data' section: the model's inputs are read from it")
    cluster = cluster or resolve(config.cluster)
    pipeline = Pipeline.from_config(_training_data(config), target="tpu" if cluster.kind == "tpu" else "cpu",
                                    num_classes=config.train.num_classes)
    model = _model_for(config, cluster, pipeline, _element_shape(pipeline, config.train.task),
                       config.train.steps_per_epoch or 1, model_fn)
    latest = tf.train.latest_checkpoint(os.path.join(config.train.run_dir, "checkpoints"))
    if latest is None:
        raise ConfigError(f"train.run_dir={config.train.run_dir!r} has no checkpoint yet; run tpu-pipeline train first")
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()  # the weights; not the optimizer or data
    return model


class WindowedPosition(tf.Module):
    """The input position of a windowed pipeline (data.sequence bucket or pack) in a checkpoint: for
    each input pipeline (one per host), where the window of its last output starts (example, chunk)
    and the outputs of it delivered, as of the last saved step (int64 vectors `example`, `chunk` and
    `in_window`, indexed by input pipeline). `fit` consumes a
    dataset, so what each element taken left the stream at is logged (`PositionLog`) and read back for
    the step a save is at.

    Each host's stream stops at a place of its own, and with several TF_CONFIG workers only the
    chief's checkpoint is kept: so before each save (at the same step on every worker) each worker
    publishes its own position in the cluster's key-value store and assigns everyone's, and the
    kept checkpoint holds every host's place."""

    def __init__(self, pipeline: Pipeline, cluster: ClusterInfo, store: Optional[KeyValueStore] = None,
                 run_key: str = "run") -> None:
        super().__init__(name="data_position")
        self._pipeline = pipeline
        self._pipelines = cluster.num_hosts
        # This process's input pipelines: its own on a TF_CONFIG worker; every host's on one client (a TPU pod slice).
        self._local = [cluster.worker_id] if cluster.num_workers > 1 else list(range(cluster.num_hosts))
        self._store = store if cluster.num_workers > 1 else None
        self._key = f"tpu_pipeline/{run_key}/data_position"
        with tf.init_scope():
            self.example = tf.Variable(tf.zeros([self._pipelines], tf.int64), trainable=False, name="example")
            self.chunk = tf.Variable(tf.zeros([self._pipelines], tf.int64), trainable=False, name="chunk")
            self.in_window = tf.Variable(tf.zeros([self._pipelines], tf.int64), trainable=False, name="in_window")
        self._logs = {index: PositionLog() for index in self._local}
        self._per_step = {index: 1 for index in self._local}  # elements a pipeline delivers per step
        self._built_at_step = 0

    def check_saved(self, path: str) -> None:
        """Refuses a checkpoint that holds the positions of another number of input pipelines (hosts)."""
        shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
        if f"{POSITION_KEY}/window/.ATTRIBUTES/VARIABLE_VALUE" in shapes:
            raise ConfigError(
                f"train.run_dir: {path} holds a packed/bucketed input position in the layout of tpu_pipeline before "
                "0.2 (window numbers), which this version cannot place exactly; start a new train.run_dir"
            )
        saved = shapes.get(f"{POSITION_KEY}/example/.ATTRIBUTES/VARIABLE_VALUE")
        if saved is not None and list(saved) != [self._pipelines]:
            held = f"{saved[0]} host(s)" if saved else "one host, in an older layout"
            raise ConfigError(
                f"train.run_dir: {path} holds the packed/bucketed input positions of {held}, and this run has "
                f"{self._pipelines}; resume it on as many hosts, or start a new train.run_dir"
            )

    def stream(self, context: tf.distribute.InputContext, step: int) -> tf.data.Dataset:
        """This input pipeline's stream from its saved position (that of `step`), each element's position logged."""
        index = context.input_pipeline_id
        if index not in self._logs:
            self._logs[index] = PositionLog()
        self._logs[index].reset()
        self._per_step[index] = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        self._built_at_step = step
        dataset = self._pipeline.build(context, start=int(self.example[index].numpy()),
                                       chunk=int(self.chunk[index].numpy()), skip=int(self.in_window[index].numpy()),
                                       with_position=True)
        return self._logs[index].attach(dataset)

    def record(self, step: int) -> None:
        """Sets every input pipeline's position to where its stream stood after global step `step` (before a save)."""
        positions = {index: self._after(index, step) for index in self._logs}
        if self._store is not None:
            positions = self._exchange(step, positions)
        examples, chunks, delivered = self.example.numpy(), self.chunk.numpy(), self.in_window.numpy()
        for index, (example, chunk, outputs) in positions.items():
            examples[index], chunks[index], delivered[index] = example, chunk, outputs
        self.example.assign(examples)
        self.chunk.assign(chunks)
        self.in_window.assign(delivered)

    def _after(self, index: int, step: int) -> tuple[int, int, int]:
        """(example, chunk where the window starts, outputs of it delivered) of this process's pipeline
        `index` after global step `step`."""
        elements = (step - self._built_at_step) * self._per_step[index]  # taken from the stream built at that step
        if elements > 0:
            return self._logs[index].after(elements)
        return int(self.example[index].numpy()), int(self.chunk[index].numpy()), int(self.in_window[index].numpy())

    def _exchange(self, step: int, mine: dict[int, tuple[int, int, int]]) -> dict[int, tuple[int, int, int]]:
        """Every worker's position at `step`: this worker's published, the others' read from the store.
        Every worker saves the same step, so the wait is a step's skew at most, unless a peer is gone."""
        key = f"{self._key}/{step}"
        try:
            for index, position in mine.items():
                self._store.set(f"{key}/{index}", " ".join(map(str, position)))
            deadline = time.monotonic() + POSITION_WAIT_SECONDS
            values = {index: self._store.get(f"{key}/{index}", timeout_seconds=max(0.001, deadline - time.monotonic()))
                      for index in range(self._pipelines)}
        except (StoreUnavailable, tf.errors.OpError) as error:
            raise ClusterError(
                f"the workers could not exchange their input positions for the checkpoint of step {step} "
                f"({str(error).splitlines()[0][:200]}); start every worker again with the same command"
            ) from None
        missing = [index for index, value in values.items() if value is None]
        if missing:
            raise ClusterError(
                f"worker {missing[0]} published no input position for the checkpoint of step {step} within "
                f"{POSITION_WAIT_SECONDS:.0f} s (it stopped or hangs); start every worker again with the same command"
            )
        return {index: tuple(int(part) for part in value.split()) for index, value in values.items()}

    def describe(self) -> str:
        """Where the input resumes: this process's pipelines, each at its own window."""
        examples, chunks, delivered = self.example.numpy(), self.chunk.numpy(), self.in_window.numpy()

        def place(index: int) -> str:
            inside = f" (its chunk {int(chunks[index])})" if chunks[index] else ""
            return (f"from the window at example {int(examples[index]):,}{inside}, past its first "
                    f"{int(delivered[index])} output(s)")

        if self._pipelines == 1:
            return f"the input pipeline continues {place(0)}"
        places = [f"input pipeline {index} of {self._pipelines} {place(index)}" for index in self._local]
        return "each host's input continues from its own place in the checkpoint: " + "; ".join(places)


def _with_token_meter(pipeline: Pipeline) -> tuple[Pipeline, Optional[TokenMeter]]:
    """A data.sequence pipeline with a TokenMeter (tokens/s, non-padding), counted where the masks and
    segment ids still are: before the outputs pick the model's keys; with data.service (whose workers
    cannot reach this host's counters) where the batches arrive, if the outputs kept them."""
    if pipeline.plan is None or pipeline.plan.sequence.value is None:
        return pipeline, None
    stages = list(pipeline.stages)
    split = pipeline.service
    if split is None:
        at = next((i for i, stage in enumerate(stages) if isinstance(stage, ToOutputs)), len(stages))
    else:
        at = stages.index(split) + 1
        arriving = dataclasses.replace(pipeline, stages=stages[:at - 1]).build().element_spec
        if not sequence_keys(arriving):
            logging.info("data.service: the outputs keep no <key>_segment_ids or <key>_mask; tokens/s is not measured")
            return pipeline, None
    tokens = TokenMeter()
    stage = tokens if split is None else _WholeElements(tokens)
    return dataclasses.replace(pipeline, stages=[*stages[:at], stage, *stages[at:]]), tokens


@dataclasses.dataclass(frozen=True)
class _WholeElements:
    """A stage that hands `stage` each element whole: tf.data spreads a tuple element (Keras's
    (inputs, targets, weights) after the outputs) over a map's arguments."""

    stage: Any

    def apply(self, dataset: tf.data.Dataset, context: Any = None) -> tf.data.Dataset:
        nested = dataset.map(lambda *parts: (parts if len(parts) > 1 else parts[0],), name="whole_elements")
        return self.stage.apply(nested, context)


def _windowed_service_stream(pipeline: Pipeline, context: tf.distribute.InputContext,
                             taken_steps: int) -> tf.data.Dataset:
    """A windowed stream through data.service, from the start of the data (a step does not say how many
    examples it held). An anonymous job is fresh for every dataset, so a later `fit` call of the same
    run skips the `taken_steps` steps its earlier one took; a named job is shared, and joining it again
    goes on where it is."""
    dataset = pipeline.build(context)
    if pipeline.service.job_name is not None or taken_steps <= 0:
        return dataset
    return dataset.skip(taken_steps * (context.num_replicas_in_sync // max(1, context.num_input_pipelines)))


def _explained(config: Config, error: Exception) -> Exception:
    """A DataError naming the file and record of a fault in the data, found by scanning the sources
    (`pipeline.data_errors`: verify's checks, stopping at the first fault); the original error when none is found."""
    for prefix in ("data", "eval_data"):
        data = getattr(config, prefix)
        if data is None:
            continue
        named = named_data_error(error, data, prefix, config.train.num_classes, vocab=config_vocabulary(config))
        if named is not None:
            return named
    return error


def _peer_failure(error: Exception) -> str:
    """The line of a collective's error that says what happened to the peer (TF's first line says little)."""
    return tf_message(error, limit=300, marks=("aborted by", "unhealthy", "connect"))


def _worker_printer(printer: Printer, worker_id: int) -> Printer:
    """Lines of a non-chief worker say whose they are (their logs often end up side by side)."""
    return lambda line: printer(f"worker {worker_id}: {line}")
