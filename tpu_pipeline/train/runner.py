"""The training job: cluster → pipelines → model → fit with checkpoints → eval → metrics.json.

The only layer that ties the others together. Resumes from the newest checkpoint in
`train.run_dir`: model, optimizer (its step counter is the learning-rate schedule's step and the
input position), and the history of finished epochs. The input pipelines are rebuilt at that
step (`Pipeline.build(start=...)`): the rest of the interrupted epoch is exactly the examples not
yet delivered, and later epochs are what they would have been.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
from functools import partial
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf
from absl import logging

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import store_for
from tpu_pipeline.config import Config
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.vocabulary import model_vocabulary, tokenizer_vocabulary
from tpu_pipeline.model import build_model, get_keras, tf_keras
from tpu_pipeline.model.checkpointed import CheckpointedModel
from tpu_pipeline.model.keras_backend import build_for_input
from tpu_pipeline.model.tasks import task_named
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.checks.record_check import tf_message
from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
from tpu_pipeline.pipeline.data_errors import DATA_ERRORS as _DATA_ERRORS, named_data_error
from tpu_pipeline.pipeline.mixtures.mixture_check import check_training_mixture
from tpu_pipeline.pipeline.mixtures.share_meter import shares_line, with_source_meter
from tpu_pipeline.pipeline.runtime.wait_meter import InputWaitMeter, metered
from tpu_pipeline.train import batch_change, started_with
from tpu_pipeline.train.cadence import Cadence, TimedCheckpointer, cadence
from tpu_pipeline.train.callbacks import EvaluationProgress, PreemptionStop, ProgressLogger, StepTracker, TrainState
from tpu_pipeline.train.data_passes import epoch_notes
from tpu_pipeline.train.example_layout import LAYOUT_KEY, ExampleLayout
from tpu_pipeline.train.framework import (framework_and_cluster, is_peer_failure, peer_errors, peer_failure,
                                          tensorboard_callback)
from tpu_pipeline.train.mixture_report import evaluate_by_source, mixture_figures
from tpu_pipeline.train.mixture_state import MIXTURE_KEY, MixtureState
from tpu_pipeline.train.model_inputs import check_eval_feeds_the_model, element_shape
from tpu_pipeline.train.peer_watch import watching_peers
from tpu_pipeline.train.preemption import Preempted, PreemptionFlag, StopAgreement
from tpu_pipeline.train.run_files import RunFiles, check_same_restore, metrics_path, read_metrics
from tpu_pipeline.train.sequence_streams import service_resume_line, windowed_service_stream, with_token_meter
from tpu_pipeline.train.stall import StallWatch, kept_line
from tpu_pipeline.train.windowed_position import POSITION_KEY, WindowedPosition

_RUN_KEYS = itertools.count()  # names this process's train() calls alike on every worker

Printer = Callable[[str], None]
# metrics.json of a run stopped by SIGTERM: the step it stopped at (the metrics so far; no evaluation yet).
PREEMPTED_KEY = "stopped_by_sigterm_at_step"


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
    """An endless stream (Keras counts epochs by steps); said only to a user who set data.repeat (default 1)."""
    if config.data.repeat != "forever":
        if "repeat" in config.data.model_fields_set:
            logging.info("data.repeat=%s: training repeats the data forever; epochs are train.steps_per_epoch long",
                         config.data.repeat)
        return config.data.model_copy(update={"repeat": "forever"})
    return config.data


def train(config: Config, *, cluster: Optional[ClusterInfo] = None, printer: Printer = _print,
          model_fn: Optional[Callable[..., Any]] = None) -> dict[str, Any]:
    """Runs (or resumes) training and evaluation; returns what it writes to run_dir/metrics.json.

    `model_fn(input_shape=[...], num_classes=N)`: your uncompiled Keras model (logits), built inside
    the strategy's scope and compiled here; it replaces config.model's network."""
    if config.data is None:
        raise ConfigError("the config has no 'data' section: training needs one (and usually eval_data)")
    config, cluster = framework_and_cluster(config, cluster)
    if not cluster.is_chief:
        printer = _worker_printer(printer, cluster.worker_id)
    printer(cluster.describe())
    saves = cadence(config.train, cluster.num_workers)
    if saves.note:
        printer(saves.note)
    if config.train.seed is not None:
        (get_keras(config.model.keras, "jax") if cluster.framework == "jax" else tf_keras).utils.set_random_seed(
            config.train.seed)
    run_dir = config.train.run_dir
    tf.io.gfile.makedirs(run_dir)
    # Before any work: a run directory resumes only the data, model and task it was started with.
    for line in started_with.check_resume(config, tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))):
        printer(line)
    run_key = f"run{next(_RUN_KEYS)}"
    store = store_for(cluster.framework) if cluster.num_workers > 1 else None
    with watching_peers(cluster, store, run_key, os.path.join(run_dir, "checkpoints")):  # on JAX
        return _train(config, cluster, printer, model_fn, saves, run_key, store)


def _train(config: Config, cluster: ClusterInfo, printer: Printer, model_fn: Optional[Callable[..., Any]],
           saves: Cadence, run_key: str, store: Any) -> dict[str, Any]:
    """`train` from its input on: the pipelines, the model, the checkpoints, the fit loop, the evaluation."""
    run_dir = config.train.run_dir
    train_data = _training_data(config)
    target = "tpu" if cluster.kind == "tpu" else "cpu"
    train_pipeline = Pipeline.from_config(train_data, target=target, num_classes=config.train.num_classes,
                                          vocab=config_vocabulary(config))
    input_shape = element_shape(train_pipeline, config.train.task)
    steps = config.train.steps_per_epoch or full_batches(train_pipeline, config.data.batch_size, "data", "train.steps_per_epoch")
    epochs = config.train.epochs
    # A mixture ending through a `stop` source before the run's steps: one line naming the source, not Keras's trace.
    check_training_mixture(train_pipeline, steps, epochs, cluster.num_hosts, cluster.num_replicas)
    for note in epoch_notes(config, train_pipeline, steps, epochs):  # a warm-up shrunk; an epoch of many passes
        printer(note)
    meter = InputWaitMeter()

    train_pipeline, tokens = with_token_meter(train_pipeline)
    train_pipeline, by_source = with_source_meter(train_pipeline)
    windowed = train_pipeline.windowed
    # Through data.service no host sees the stream's windows (the service decides which worker makes
    # which row), so there a windowed stream restarts as an image stream does, at a data epoch's start.
    mixture_state = MixtureState.of(train_pipeline, cluster.num_hosts)  # a mixture's weights, and since when
    position = (WindowedPosition(train_pipeline, cluster, store, run_key, mixture_state)
                if windowed is not None and train_pipeline.service is None else None)
    layout = ExampleLayout.of(train_pipeline, cluster, config, mixture_state)  # an example stream's places, dealt
    resumed_from = 0

    def train_dataset(step: int) -> Any:
        """The distributed training stream from global step `step` on (its input position)."""
        if position is not None:
            return cluster.strategy.distribute_datasets_from_function(
                lambda context: metered(position.stream(context, step), meter, context))
        if windowed is not None and train_pipeline.service is not None:
            return cluster.strategy.distribute_datasets_from_function(
                lambda context: metered(windowed_service_stream(train_pipeline, context, step - resumed_from), meter,
                                        context))
        if layout is not None:
            return cluster.strategy.distribute_datasets_from_function(
                lambda context: metered(layout.stream(context, step), meter, context))
        return cluster.strategy.distribute_datasets_from_function(
            lambda context: metered(for_input(context).build(context, start=step * train_pipeline.examples_per_step(context)),
                                    meter, context)
        )

    def for_input(context: tf.distribute.InputContext) -> Pipeline:
        """The pipeline of one input pipeline: a mixture's continues its own saved weights."""
        return mixture_state.pipeline(context.input_pipeline_id) if mixture_state is not None else train_pipeline

    def exact_evaluation(evaluated: Config) -> tuple[Any, int, Pipeline]:
        """evaluated.eval_data's distributed dataset, its steps and its pipeline. Exact: every example of one
        pass once, the last batch padded with zero-weight examples."""
        pipeline = Pipeline.from_config(evaluated.eval_data, target=target, prefix="eval_data",
                                        num_classes=config.train.num_classes, vocab=config_vocabulary(config)).for_evaluation()
        dataset = pipeline.distribute(cluster.strategy, check=partial(check_eval_feeds_the_model, config, input_shape))
        eval_steps = config.train.eval_steps or pipeline.evaluation_steps(cluster.num_replicas, cluster.num_hosts)
        return dataset, eval_steps, pipeline

    eval_dataset, validation_steps, eval_pipeline = None, None, None
    if config.eval_data is not None:
        eval_dataset, validation_steps, eval_pipeline = exact_evaluation(config)

    model = _model_for(config, cluster, train_pipeline, input_shape, steps, model_fn)
    state = TrainState(task_named(config.train.task))
    started_with_now = started_with.variable(config, cluster.num_hosts)
    held = CheckpointedModel(model)  # a JAX model's weights go in as tf.Variable copies (model.checkpointed)
    checkpoint = tf.train.Checkpoint(**held.parts, epoch=state.epoch, history=state.history_json,
                                     **{started_with.STARTED_WITH_KEY: started_with_now},
                                     **({POSITION_KEY: position} if position is not None else {}),
                                     **({LAYOUT_KEY: layout} if layout is not None else {}),
                                     **({MIXTURE_KEY: mixture_state} if mixture_state is not None else {}))
    files = RunFiles(run_dir, cluster, checkpoint, config.train.max_checkpoints)

    @contextlib.contextmanager
    def said_in_one_line() -> Iterator[None]:
        """A bad record, or a peer host's death, ends fit or evaluate with one line that says what to do."""
        try:
            yield
        except _DATA_ERRORS as error:
            raise _explained(config, error) from None
        except peer_errors(cluster) as error:
            if not is_peer_failure(error, cluster):
                raise
            raise peer_failure(error, files.latest_checkpoint) from None
    latest = files.latest_checkpoint
    if store is not None:
        check_same_restore(store, cluster, run_key, latest)
    total_steps = steps * epochs
    if latest:
        if position is not None:
            position.check_saved(latest)
        try:
            restored = checkpoint.restore(latest)
        except (ValueError, tf.errors.InvalidArgumentError) as error:  # a weight of another shape
            raise ConfigError(
                f"train.run_dir={run_dir}: {latest} does not fit this config's model ({tf_message(error, limit=200)}); "
                "a change train.allow_changes accepts must keep the weights' shapes: start a new train.run_dir"
            ) from None
        held.after_restore()
        started_with_now.assign(json.dumps(started_with.record(config, cluster.num_hosts)))  # an accepted change is what goes on
        resumed_from = batch_change.go_on_by_examples(latest, config, model, steps, layout or position, lambda was: (
            config.train.steps_per_epoch or full_batches(train_pipeline, was, "data", "steps")), printer)
        finished = read_metrics(run_dir) if resumed_from >= total_steps else None
        if finished is not None and PREEMPTED_KEY not in finished:  # a SIGTERM's metrics lack the evaluation
            # Nothing to train: the optimizer's slots are never built, so their saved values stay
            # unmatched on purpose (without this, TF warns once per slot at exit).
            restored.expect_partial()
            done = int(state.epoch.numpy())
            past = (f", past {epochs} epoch(s) of {steps} steps of this data" if done < epochs else "")
            printer(f"run already complete: {done} of {epochs} epoch(s), step {resumed_from}{past} "
                    f"({latest}); nothing changed. Its metrics: {metrics_path(run_dir)}. To train on, run it again "
                    f"with train.epochs={resumed_from // steps + 1} or more")
            return finished
        epoch_now, into = divmod(resumed_from, steps)
        if position is not None:
            where = position.resume()  # (a bucketed stream's places regrouped for another slice)
        elif layout is not None:
            where = layout.resume(resumed_from, run_dir)
        elif train_pipeline.service is None:
            where = (f"the input pipelines continue from example {resumed_from * config.data.batch_size:,} "
                     "of the training stream")
        else:
            where = service_resume_line(train_pipeline, resumed_from, config.data.batch_size)
        printer(f"resumed from {latest}: step {resumed_from} (epoch {epoch_now + 1}, step {into} of {steps}); {where}")
        if mixture_state is not None:  # weights changed: the rows in flight keep the old ones; said in a line
            saved_at = ((lambda context: position.saved(context.input_pipeline_id)) if position is not None else
                        (lambda context: (layout.start_of(context.input_pipeline_id, resumed_from) if layout else
                                          resumed_from * train_pipeline.examples_per_step(context), 0, 0)))
            for line in mixture_state.resume(saved_at, cluster.num_replicas):
                printer(line)
            if position is not None:
                position.pipeline_of = mixture_state.pipeline

    tracker = StepTracker() if held.on_jax else None  # JAX: the step is counted, not read mid-fit
    progress = ProgressLogger(config.data.batch_size, config.train.log_every_steps, meter, total_steps, printer, epochs,
                              tokens=tokens, task=state.task, sources=by_source, mixture=train_data.mixture,
                              steps=tracker)
    agreement = StopAgreement(store, cluster.worker_id, cluster.num_workers, run_key) if store is not None else None
    # A training input that answers no request (stuck, or endlessly empty) ends the run with a line (train.stall).
    watch = StallWatch(meter, config.train.input_stall_seconds, train_pipeline, printer,
                       lambda: kept_line(files.latest_checkpoint))
    with PreemptionFlag(agreement) as preemption, watch:
        def before_save(step: int) -> None:
            held.before_save()
            if position is not None:
                position.record(step)
            if layout is not None:
                layout.record(step)

        checkpointer = TimedCheckpointer(files, state, steps, plan=saves, preemption=preemption, printer=printer,
                                         before_save=before_save, steps=tracker)
        evaluation_progress = EvaluationProgress(validation_steps, printer)
        callbacks: list[Any] = [*([tracker] if tracker is not None else []), progress, checkpointer,
                                evaluation_progress]
        if config.train.tensorboard:
            callbacks.append(tensorboard_callback(config, cluster, os.path.join(run_dir, "tensorboard"), printer))
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
            watch.new_stream()
            dataset = train_dataset(step)
            build_for_input(model, dataset.element_spec)  # Keras 3 would take a batch apart to build its metrics
            try:
                with said_in_one_line():
                    model.fit(
                        dataset, epochs=last_epoch, initial_epoch=epoch_now, steps_per_epoch=steps - into,
                        validation_data=eval_dataset, validation_steps=validation_steps,
                        validation_freq=config.train.eval_every_epochs, callbacks=callbacks, verbose=0,
                        shuffle=False,  # the pipeline shuffles (Keras 3 warns that it ignores True for a dataset)
                    )
            except PreemptionStop:
                # Saved; `fit` was left before its epoch-end validation and callbacks. TensorBoard's
                # writers are closed as `fit` would have (their last events flushed).
                for callback in callbacks:
                    callback.on_train_end()
                break
            step = int(model.optimizer.iterations.numpy())
        train_seconds = time.perf_counter() - started
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
    if by_source is not None:  # a mixture: what the batches held of each source, beside its weight
        metrics["mixture"] = mixture_figures(train_data.mixture, *by_source.totals(), counted_from_step=resumed_from)
    skipped = {p.skipped.section: p.skipped.as_dict() for p in (train_pipeline, eval_pipeline) if p and p.skipped}
    if skipped:
        metrics["skipped"] = skipped  # data.on_error=skip: records left out, by kind and file
    if checkpointer.preempted_at is not None:
        # A preemption notice leaves seconds: the metrics so far (no evaluation), then exit 143.
        metrics[PREEMPTED_KEY] = checkpointer.preempted_at
        metrics["stopped_by"] = preemption.reason
        files.write_metrics(metrics)
        printer(f"stopped by {metrics['stopped_by']} at step {checkpointer.preempted_at} of {total_steps}; the checkpoint is saved "
                f"and the metrics so far are in {metrics_path(run_dir)} (no evaluation): start the same command "
                "again to resume")
        sys.stdout.flush()
        raise Preempted(preemption.exit_code)
    if by_source is not None:
        printer("trained on " + shares_line(train_data.mixture, *by_source.totals())
                + f" (from step {resumed_from}; all counts: 'mixture' in {metrics_path(run_dir)})")
    if skipped:
        printer("data.on_error=skip left out " + ", ".join(
            f"{part['skipped']:,} of {part['records']:,} records in {section}" for section, part in skipped.items()
        ) + f" (by kind and file: 'skipped' in {metrics_path(run_dir)})")
    if eval_dataset is not None:
        # The last epoch's validation, when `fit` ran one, measured these very weights on the same steps: a
        # second pass would cost as long again (minutes on a large split) for the same figures.
        evaluation = state.validation_after(epochs - 1)
        if evaluation is None:
            with said_in_one_line():
                evaluation = model.evaluate(eval_dataset, steps=validation_steps, verbose=0, return_dict=True,
                                            callbacks=[EvaluationProgress(validation_steps, printer)])
        metrics.update(state.task.evaluation_figures(evaluation))  # eval_loss: the weighted cross-entropy
        metrics["eval_examples"] = None if config.train.eval_steps else eval_pipeline.source.count_examples()
        if config.eval_data.mixture is not None:
            def evaluate(evaluated: Config) -> dict[str, float]:
                dataset, eval_steps, _ = exact_evaluation(evaluated)
                with said_in_one_line():
                    figures = model.evaluate(dataset, steps=eval_steps, verbose=0, return_dict=True)
                return state.task.evaluation_figures(figures)

            metrics["eval_by_source"] = evaluate_by_source(config, evaluate, printer)
    files.write_metrics(metrics)
    printer("final: " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
        if k not in ("cluster", "history", "skipped", "mixture", "eval_by_source")
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
    config, cluster = framework_and_cluster(config, cluster)
    pipeline = Pipeline.from_config(_training_data(config), target="tpu" if cluster.kind == "tpu" else "cpu",
                                    num_classes=config.train.num_classes)
    model = _model_for(config, cluster, pipeline, element_shape(pipeline, config.train.task),
                       config.train.steps_per_epoch or 1, model_fn)
    latest = tf.train.latest_checkpoint(os.path.join(config.train.run_dir, "checkpoints"))
    if latest is None:
        raise ConfigError(f"train.run_dir={config.train.run_dir!r} has no checkpoint yet; run tpu-pipeline train first")
    held = CheckpointedModel(model, with_optimizer=False)
    tf.train.Checkpoint(**held.parts).restore(latest).expect_partial()  # the weights; not the optimizer or data
    held.after_restore()
    return model


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


def _worker_printer(printer: Printer, worker_id: int) -> Printer:
    """Lines of a non-chief worker say whose they are (their logs often end up side by side)."""
    return lambda line: printer(f"worker {worker_id}: {line}")
