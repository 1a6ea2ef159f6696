"""Variable-length tokens into static rows, end to end: our data.sequence modes against the usual ways.

    .venv/bin/python benchmarks/bench_sequences.py --rounds 3 --seconds 2
    .venv/bin/python benchmarks/bench_sequences.py --workloads long@1024,text@1024 --skip "ours bucket"
    git worktree add /tmp/aa97487 aa97487      # once: another commit, beside this one
    .venv/bin/python benchmarks/bench_sequences.py --against /tmp/aa97487 --rounds 7 --seconds 3 --warmup 2

--against TREE: our pack mode (this checkout), the same config built by TREE's `tpu_pipeline` (a worktree
of another commit) and seqio's packer, on each workload, each pipeline in a fresh process of its own
(`pack_child.py`; PYTHONPATH names the tree it imports), in a rotated order every round. The config
is a user's: pack, overflow truncate, every other key at its default (records shuffled, and rows
where the tree shuffles them); batches of 64 rows (docs@256: 32, as issue 37 measured). Printed:
each round with the load average, then per pipeline real tokens per second and CPU milliseconds
(the process's, all threads) per 1,000 real tokens, and the ratios to TREE and to seqio within each
round as median (worst–best) over the rounds: the spread is this shared machine's noise. A last
table sums up every workload. Run it with .venv-tpu/bin/python for the TPU TensorFlow (its children
use the same interpreter).

Every pipeline reads the SAME TFRecord files (benchmarks/sequence_workloads.py: tf.Examples with one
variable-length int64 `tokens` feature, generated once under $TPU_PIPELINE_CACHE/bench), parses them
(parse is part of every pipeline's cost) and delivers batches of 64 rows of int32 tokens, repeating
the files forever, on one input pipeline on the CPU:

  ours pack       data.sequence mode pack (overflow truncate), built by Pipeline.from_config
  ours bucket     data.sequence mode bucket, boundaries L/8, L/4, L/2, L (overflow truncate)
  ours pad        data.sequence mode pad (overflow truncate)
  pack, batched   our Packer stage (tpu_pipeline.pipeline.sequences.packing, first fit decreasing, truncate) used
                  directly on a batched parse: parse_example of 1024 records, each parsed ragged
                  batch packed as one window (Packer(window=None)), then batch: what packing costs
                  without a per-example element in front of it
  pad (tfm)       what tensorflow/models does: parse each example, cut/pad it to L with an input
                  mask, batch
  tf bucket       tf.data's own `Dataset.bucket_by_sequence_length` with pad_to_bucket_boundary=True
                  and the same bucket lengths as ours (tf's boundaries are exclusive: ours + 1)
  seqio pack      seqio.utils.trim_and_pack_dataset (next fit, one open row; ids + 1, since it counts
                  non-zero tokens as the length), parsed one example at a time, then batch
  concat-split    all tokens of a batched parse (parse_example of 1024 records) concatenated and cut
                  into rows of L (`rebatch` of the flat values): no padding at all, the physical limit
                  of density (nothing is truncated either: more tokens per example than the others)
  parse only      batched parse (`parse_example` of 1024 records, RaggedFeature) and nothing else
  parse 1-by-1    `parse_single_example` of each record, then ragged_batch(64), and nothing else
  LM pack         a language model's pipeline: lm_shift, data.sequence keys [inputs, targets], mode pack
                  (overflow truncate), outputs derived for train.task language_model
  LM pack, weights  the same on the same tokens with loss weights inside them, as `convert --from chat`
                  writes them (`weighted_tokens`, 2 * id + weight; 0 on each document's first half, 1 on
                  the rest): lm_shift key weighted_tokens, keys [inputs, targets, loss_weights]. Issue 50
                  asks it to keep 0.9x the tokens/s of LM pack (the table's last line)

The packing-cost target: the packing stage's CPU µs per example (ours pack − ours pad, the same
pipeline with mode pad: same read and parse; pack, batched − parse only) beside the parse that feeds
it measured alone (parse only, or parse 1-by-1 where our plan parses one record at a time). Our plan
(printed per workload: W, and its parse) may read records in blocks (data.record_block), which the
plain tf.data pipelines here do not: ours can beat "parse only".

Measured per pipeline: non-padding tokens per second, per CPU-second (all threads of this process),
the non-padding fraction (non-padding tokens / token slots delivered: a bucket's padding examples
and a packed row's tail count as slots), examples per second and CPU µs per example. Non-padding
is counted from masks or segment ids (never by value: id 0 is a real token here), examples from
segment ids or masks (concat-split: tokens / mean example length).

Each round builds every pipeline afresh in a rotated order, pulls batches inside a tf.function for
--warmup seconds after the first batch (past the packer's XLA compile on its first windows), then
times about --seconds of batches. Ratios are taken within a round, then median and worst (lowest)
over rounds. Absolute rates drift on a shared 2-core machine: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

import sequence_workloads  # noqa: E402
from bench_packing import import_seqio_utils  # noqa: E402
from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402
from tpu_pipeline.pipeline.sequences.packing import Packer  # noqa: E402

KEY = sequence_workloads.KEY
BATCH = 64
AUTO = tf.data.AUTOTUNE
WORKLOADS = {  # name: (files, row length)
    "long@1024": ("seq_long", 1024),
    "long@2048": ("seq_long", 2048),
    "short@128": ("seq_short", 128),
    "text@1024": ("seq_text", 1024),
    "docs@256": ("seq_docs", 256),
}
AGAINST_BATCH = {"docs@256": 32}  # --against: rows a batch where not BATCH (issue 37 measured docs@256 at 32)
SEQIO = "seqio pack"
PAD_TFM = "pad (tfm)"
PARSE = "parse only"
PARSE_ONE = "parse 1-by-1"
PACK_WINDOW = 1024  # "pack, batched": examples per batched parse, each packed as one window (the plan's auto window)

Counter = Callable[[Any], tuple[tf.Tensor, tf.Tensor, tf.Tensor]]  # batch -> (non-padding, slots, examples)


def boundaries(length: int) -> list[int]:
    return [length // 8, length // 4, length // 2, length]


# --- counting what a batch delivers ---------------------------------------------------------------

def _i64(value: tf.Tensor) -> tf.Tensor:
    return tf.cast(value, tf.int64)


def count_segments(batch: dict) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Packed rows: non-padding = segment id > 0; examples = the highest segment id of each row."""
    segments = batch[f"{KEY}_segment_ids"]
    return (tf.math.count_nonzero(segments, dtype=tf.int64), _i64(tf.size(segments)),
            _i64(tf.reduce_sum(tf.reduce_max(segments, axis=1))))


def count_mask(mask_key: str, example_key: str | None = None) -> Counter:
    """Padded rows: non-padding = the mask's sum; examples = rows (or the example mask's sum)."""
    def count(batch: dict) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        mask = batch[mask_key]
        examples = tf.reduce_sum(_i64(batch[example_key])) if example_key else _i64(tf.shape(mask)[0])
        return tf.reduce_sum(_i64(mask)), _i64(tf.size(mask)), examples
    return count


def count_dense(mean_length: float) -> Counter:
    def count(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        size = _i64(tf.size(batch))
        return size, size, _i64(tf.round(tf.cast(size, tf.float64) / mean_length))
    return count


def count_parsed(batch: dict) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    tokens = _i64(tf.size(batch[KEY].flat_values))
    return tokens, tokens, _i64(batch[KEY].nrows())


# --- the pipelines ----------------------------------------------------------------------------------

def records(pattern: str) -> tf.data.Dataset:
    """Serialized records of every shard, round robin, forever (the baselines' common reader)."""
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    return files.repeat().interleave(tf.data.TFRecordDataset, cycle_length=sequence_workloads.SHARDS,
                                     num_parallel_calls=AUTO)


def parse_one(record: tf.Tensor) -> tf.Tensor:
    """One tf.Example's tokens, 1-D int32."""
    return tf.cast(tf.io.parse_single_example(record, {KEY: tf.io.RaggedFeature(tf.int64)})[KEY], tf.int32)


def parse_batch(records_: tf.Tensor) -> dict:
    parsed = tf.io.parse_example(records_, {KEY: tf.io.RaggedFeature(tf.int64)})
    return {KEY: tf.cast(parsed[KEY], tf.int32)}


def ours_config(pattern: str, length: int, mode: str) -> dict:
    sequence: dict[str, Any] = {"keys": [KEY], "length": length, "mode": mode, "overflow": "truncate"}
    if mode == "bucket":
        sequence["boundaries"] = boundaries(length)
    return {"data": {"source": {"type": "tfrecord", "files": pattern},
                     "features": {KEY: {"dtype": "int64", "kind": "ragged"}},
                     "sequence": sequence, "batch_size": BATCH, "repeat": "forever", "shuffle": {"enabled": False}}}


def lm_pack(pattern: str, length: int, weights: bool) -> tf.data.Dataset:
    """A language model's packed pipeline (lm_shift, derived outputs); `weights`: with each target's loss weight."""
    key = sequence_workloads.WEIGHTED if weights else KEY  # the weights inside the tokens (convert --from chat)
    keys = ["inputs", "targets"] + ([sequence_workloads.WEIGHTS] if weights else [])
    data = {"source": {"type": "tfrecord", "files": pattern}, "features": {key: {"dtype": "int64", "kind": "ragged"}},
            "preprocess": [{"op": "lm_shift", "key": key}],
            "sequence": {"keys": keys, "length": length, "mode": "pack", "overflow": "truncate"},
            "batch_size": BATCH, "repeat": "forever", "shuffle": {"enabled": False}}
    config = config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})
    return Pipeline.from_config(config.data).build()


def count_lm(batch: tuple) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(inputs, targets, weights) batches: real tokens and examples from the inputs' segment ids."""
    return count_segments({KEY: batch[0]["inputs"], f"{KEY}_segment_ids": batch[0]["inputs_segment_ids"]})


def ours(pattern: str, length: int, mode: str) -> tf.data.Dataset:
    config = config_from_dict(ours_config(pattern, length, mode)).data
    return Pipeline.from_config(config).build()


def pack_batched(pattern: str, length: int) -> tf.data.Dataset:
    """Our Packer stage alone on a batched parse: each parsed [W, None] batch packed as one window."""
    parsed = records(pattern).batch(PACK_WINDOW).map(parse_batch, num_parallel_calls=AUTO)
    stage = Packer({KEY: length}, window=None, overflow="truncate")
    return stage.apply(parsed).batch(BATCH, drop_remainder=True).prefetch(AUTO)


def pad_tfm(pattern: str, length: int) -> tf.data.Dataset:
    """tensorflow/models' way: decode one example, cut and pad it to `length` with an input mask, batch."""
    def pad(record: tf.Tensor) -> dict:
        tokens = parse_one(record)[:length]
        size = tf.size(tokens)
        return {KEY: tf.ensure_shape(tf.pad(tokens, [[0, length - size]]), [length]),
                "input_mask": tf.ensure_shape(tf.pad(tf.ones([size], tf.int32), [[0, length - size]]), [length])}
    return records(pattern).map(pad, num_parallel_calls=AUTO).batch(BATCH, drop_remainder=True).prefetch(AUTO)


def tf_bucket(pattern: str, length: int) -> tf.data.Dataset:
    """tf.data's bucket_by_sequence_length, padded to each bucket's length (ours + 1: tf's are exclusive)."""
    def parse(record: tf.Tensor) -> dict:
        tokens = parse_one(record)[:length]
        return {KEY: tokens, "input_mask": tf.ones_like(tokens)}
    bounds = [b + 1 for b in boundaries(length)]
    dataset = records(pattern).map(parse, num_parallel_calls=AUTO)
    dataset = dataset.bucket_by_sequence_length(
        lambda example: tf.shape(example[KEY])[0], bounds, [BATCH] * (len(bounds) + 1),
        pad_to_bucket_boundary=True, drop_remainder=True)
    return dataset.prefetch(AUTO)


def seqio_pack(seqio_utils: Any, pattern: str, length: int, batch: int = BATCH) -> tf.data.Dataset:
    dataset = records(pattern).map(lambda record: {KEY: parse_one(record) + 1}, num_parallel_calls=AUTO)
    return seqio_utils.trim_and_pack_dataset(dataset, {KEY: length}).batch(batch, drop_remainder=True).prefetch(AUTO)


def concat_split(pattern: str, length: int) -> tf.data.Dataset:
    """Every token, concatenated and cut into rows: batched parse → flat values → rebatch(64 × length)."""
    flat = records(pattern).batch(PACK_WINDOW).map(lambda r: parse_batch(r)[KEY].flat_values, num_parallel_calls=AUTO)
    rows = flat.rebatch(BATCH * length, drop_remainder=True)
    return rows.map(lambda tokens: tf.reshape(tokens, [BATCH, length])).prefetch(AUTO)


def parse_only(pattern: str) -> tf.data.Dataset:
    return records(pattern).batch(PACK_WINDOW).map(parse_batch, num_parallel_calls=AUTO).prefetch(AUTO)


def parse_one_by_one(pattern: str) -> tf.data.Dataset:
    dataset = records(pattern).map(lambda record: {KEY: parse_one(record)}, num_parallel_calls=AUTO)
    return dataset.ragged_batch(BATCH, drop_remainder=True).prefetch(AUTO)


LM_PACK, LM_WEIGHTS = "LM pack", "LM pack, weights"


def pipelines(pattern: str, length: int, mean_length: float, seqio_utils: Any,
              weighted: str = "") -> dict[str, tuple[Callable, Counter]]:
    out: dict[str, tuple[Callable, Counter]] = {
        "ours pack": (lambda: ours(pattern, length, "pack"), count_segments),
        "ours bucket": (lambda: ours(pattern, length, "bucket"), count_mask(f"{KEY}_mask", "example_mask")),
        "ours pad": (lambda: ours(pattern, length, "pad"), count_mask(f"{KEY}_mask")),
        "pack, batched": (lambda: pack_batched(pattern, length), count_segments),
        PAD_TFM: (lambda: pad_tfm(pattern, length), count_mask("input_mask")),
        "tf bucket": (lambda: tf_bucket(pattern, length), count_mask("input_mask")),
    }
    if seqio_utils is not None:
        out[SEQIO] = (lambda: seqio_pack(seqio_utils, pattern, length), count_segments)
    out["concat-split"] = (lambda: concat_split(pattern, length), count_dense(mean_length))
    out[PARSE] = (lambda: parse_only(pattern), count_parsed)
    out[PARSE_ONE] = (lambda: parse_one_by_one(pattern), count_parsed)
    out[LM_PACK] = (lambda: lm_pack(pattern, length, False), count_lm)
    if weighted:
        out[LM_WEIGHTS] = (lambda: lm_pack(weighted, length, True), count_lm)
    return out


# --- timing -----------------------------------------------------------------------------------------

def consumer(count: Counter) -> Callable:
    @tf.function
    def consume(iterator: Any, batches: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        tokens = tf.constant(0, tf.int64)
        slots = tf.constant(0, tf.int64)
        examples = tf.constant(0, tf.int64)
        for _ in tf.range(batches):
            t, s, e = count(next(iterator))
            tokens += t
            slots += s
            examples += e
        return tokens, slots, examples
    return consume


def measure(build: Callable[[], tf.data.Dataset], count: Counter, warmup: float, seconds: float) -> dict:
    """Build, pull one batch, warm up for `warmup` seconds, then time about `seconds` of batches."""
    consume = consumer(count)
    iterator = iter(build())
    consume(iterator, tf.constant(1, tf.int64))
    start, pulled = time.perf_counter(), 0
    while time.perf_counter() - start < warmup:
        consume(iterator, tf.constant(4, tf.int64))
        pulled += 4
    rate = pulled / max(time.perf_counter() - start, 1e-3)
    batches = max(4, int(rate * seconds))
    process = psutil.Process()
    cpu = sum(process.cpu_times()[:2])
    start = time.perf_counter()
    tokens, slots, examples = (int(v) for v in consume(iterator, tf.constant(batches, tf.int64)))
    elapsed = time.perf_counter() - start
    cpu = sum(process.cpu_times()[:2]) - cpu
    return {"seconds": elapsed, "cpu": cpu, "batches": batches, "tokens": tokens, "slots": slots, "examples": examples,
            "tok_s": tokens / elapsed, "tok_cpu_s": tokens / max(cpu, 1e-9), "fill": tokens / max(slots, 1),
            "ex_s": examples / elapsed, "cpu_us_ex": cpu / max(examples, 1) * 1e6}


def ratio_cell(rounds: list[dict], name: str, reference: str, field: str) -> str:
    if reference not in rounds[0] or name == reference:
        return "-"
    ratios = [r[name][field] / r[reference][field] for r in rounds]
    return f"{statistics.median(ratios):5.2f} ({min(ratios):4.2f})"


def plan_of(pattern: str, length: int) -> dict:
    """What our plan decides for the pack config: the window W (data.sequence.window: auto), why, and the parse."""
    try:
        plan = Pipeline.from_config(config_from_dict(ours_config(pattern, length, "pack")).data).plan
        return {"window": plan.sequence.value.window, "why": plan.sequence.reason, "parse": plan.parse.value}
    except Exception as error:  # noqa: BLE001 (printed, never hidden)
        return {"window": None, "why": f"{type(error).__name__}: {error}", "parse": "?"}


def skipped_names(skip: str, table: dict) -> list[str]:
    """--skip's names: comma-separated, where a name may hold a comma itself ("pack, batched")."""
    names = [name for name in table if "," in name and name in skip]
    for name in names:
        skip = skip.replace(name, "")
    return names + [name.strip() for name in skip.split(",") if name.strip()]


def bench_workload(workload: str, args: argparse.Namespace, seqio_utils: Any) -> dict:
    name, length = WORKLOADS[workload]
    meta = sequence_workloads.ensure(name, args.cache_dir)
    pattern = os.path.join(meta["dir"], "train-*.tfrecord")
    weighted = os.path.join(sequence_workloads.ensure(name, args.cache_dir, weights="inside")["dir"], "train-*.tfrecord")
    table = pipelines(pattern, length, meta["lengths"]["mean"], seqio_utils, weighted)
    for skipped in skipped_names(args.skip, table):
        table.pop(skipped, None)
    names = list(table)
    result = {"workload": workload, "files": name, "length": length, "stats": meta["lengths"],
              "plan": plan_of(pattern, length), "names": names, "rounds": []}
    print_header(result)
    for index in range(args.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        results = {}
        for pipeline in order:
            build, count = table[pipeline]
            results[pipeline] = measure(build, count, args.warmup, args.seconds)
        result["rounds"].append(results)
        print(f"  round {index + 1}: " + ", ".join(f"{n} {results[n]['tok_s'] / 1e6:.2f}" for n in names)
              + " M non-padding tokens/s", flush=True)
    print_table(result)
    return result


def print_header(result: dict) -> None:
    stats, length, plan = result["stats"], result["length"], result["plan"]
    kept = stats["kept"].get(str(length))
    over = stats["over"].get(str(length), 0)
    print(f"\n== {result['workload']}: {stats['examples']} examples ({result['files']}), median {stats['median']:.0f} "
          f"tokens, mean {stats['mean']:.0f}, max {stats['max']}, {over:.1%} over {length}; "
          f"rows of {length}, batches of {BATCH} rows; bucket lengths {boundaries(length)}"
          + (f"; truncating keeps {kept / stats['tokens']:.1%} of the tokens" if kept else "") + " ==", flush=True)
    print(f"  ours pack: W = {plan['window']} ({plan['why']}); our plan's parse: {plan['parse']}", flush=True)


def print_table(result: dict) -> None:
    rounds, names = result["rounds"], result["names"]

    def med(pipeline: str, field: str) -> float:
        return statistics.median(r[pipeline][field] for r in rounds)

    def ratios(a: str, b: str, field: str = "tok_s") -> list[float]:
        return [r[a][field] / r[b][field] for r in rounds]

    def differences(a: str, b: str) -> list[float]:
        return [r[a]["cpu_us_ex"] - r[b]["cpu_us_ex"] for r in rounds]

    print(f"{'pipeline':14s} {'non-pad':>7s} {'Mtok/s':>7s} {'Mtok/CPU-s':>10s} {'ex/s':>8s} {'CPU µs/ex':>9s} "
          f"{'cores':>5s} | {'tok/s ÷ seqio':>13s} {'tok/CPU-s ÷ seqio':>17s} {'tok/s ÷ pad(tfm)':>16s}")
    for pipeline in names:
        cores = med(pipeline, "cpu") / med(pipeline, "seconds")
        print(f"{pipeline:14s} {med(pipeline, 'fill'):7.3f} {med(pipeline, 'tok_s') / 1e6:7.2f} "
              f"{med(pipeline, 'tok_cpu_s') / 1e6:10.2f} {med(pipeline, 'ex_s'):8,.0f} "
              f"{med(pipeline, 'cpu_us_ex'):9.1f} {cores:5.2f} | {ratio_cell(rounds, pipeline, SEQIO, 'tok_s'):>13s} "
              f"{ratio_cell(rounds, pipeline, SEQIO, 'tok_cpu_s'):>17s} "
              f"{ratio_cell(rounds, pipeline, PAD_TFM, 'tok_s'):>16s}")
    # The packing stage's cost: the packer minus the same pipeline without it (ours: mode pad, which
    # reads and parses the same way), beside the cost of the parse that feeds it, measured alone.
    ours_parse = PARSE if result["plan"]["parse"] == "batched" else PARSE_ONE
    for packer, without, parse in (("ours pack", "ours pad", ours_parse), ("pack, batched", PARSE, PARSE)):
        if packer not in names:
            continue
        line = f"  {packer}: non-padding {med(packer, 'fill'):.3f}"
        if SEQIO in names:
            line += (f"; tokens/s ÷ seqio {statistics.median(ratios(packer, SEQIO)):.2f} "
                     f"(worst {min(ratios(packer, SEQIO)):.2f})")
        if without in names:
            stage = statistics.median(differences(packer, without))
            line += f"; packing stage ({packer} − {without}) {stage:.1f} CPU µs/ex"
        if parse in names:
            line += f" vs the parse feeding it ({parse}) {med(parse, 'cpu_us_ex'):.1f}"
        print(line, flush=True)
    if LM_PACK in names and LM_WEIGHTS in names:  # issue 50: weights ride along at >= 0.9x the tokens/s
        speed, cpu = ratios(LM_WEIGHTS, LM_PACK), ratios(LM_PACK, LM_WEIGHTS, "cpu_us_ex")
        print(f"  {LM_WEIGHTS} ÷ {LM_PACK}: tokens/s {statistics.median(speed):.2f} (worst {min(speed):.2f}), CPU per "
              f"example {1 / statistics.median(cpu):.2f}x", flush=True)


# --- --against: our pack mode beside another commit's and seqio's, each in a process of its own -------

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pack_child.py")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit_of(tree: str) -> str:
    """The short commit of a checkout, with '+' when its tracked files differ from it."""
    def git(*command: str) -> str:
        return subprocess.run(["git", "-C", tree, *command], capture_output=True, text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or os.path.basename(tree)) + ("+" if git("status", "--short", "-uno") else "")


def run_child(tree: str, pipeline: str, files: str, length: int, batch: int, args: argparse.Namespace) -> dict:
    """pack_child.py in a fresh process importing `tree`'s tpu_pipeline; its measurement, with rates."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, CHILD, "--pipeline", pipeline, "--files", files, "--length", str(length),
               "--batch", str(batch), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"{pipeline} in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if os.path.realpath(out["tree"]) != os.path.realpath(tree):
        raise SystemExit(f"the child meant to measure {tree} imported tpu_pipeline from {out['tree']}")
    real = max(out["real"], 1)
    return {**out, "tok_s": out["real"] / out["seconds"], "tok_cpu_s": out["real"] / max(out["cpu"], 1e-9),
            "ms_1k": out["cpu"] / real * 1e6, "fill": out["real"] / max(out["slots"], 1)}


def spread(values: list[float], digits: int = 2) -> str:
    """median (worst–best): the worst is the lowest."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def against(args: argparse.Namespace) -> None:
    """Each workload: ours (this tree), theirs (--against's tree) and seqio, a process each, in rotated
    order every round; ratios within a round, then median (worst–best) over the rounds."""
    theirs_tree = os.path.abspath(args.against)
    ours_name, theirs_name = f"ours ({commit_of(HERE)})", commit_of(theirs_tree)
    have_seqio = import_seqio_utils() is not None
    entries = [(ours_name, HERE, "ours"), (theirs_name, theirs_tree, "ours")] + (
        [(SEQIO, HERE, "seqio")] if have_seqio else [])
    print(f"--against {theirs_tree}: {ours_name} vs {theirs_name}" + ("" if have_seqio else " (no seqio: not installed)")
          + f"; {sys.executable}, TF {tf.__version__}, {os.cpu_count()} CPUs; {args.rounds} rounds, each pipeline a "
          f"process of its own: {args.warmup} s warm-up + ~{args.seconds} s timed; CPU = the process's, all threads")
    summary = []
    for workload in args.workloads.split(","):
        name, length = WORKLOADS[workload]
        meta = sequence_workloads.ensure(name, args.cache_dir)
        files = os.path.join(meta["dir"], "train-*.tfrecord")
        batch = AGAINST_BATCH.get(workload, BATCH)
        stats = meta["lengths"]
        shortest = f"{stats['min']}–" if "min" in stats else "up to "
        print(f"\n== {workload}: {stats['examples']} documents ({name}) of {shortest}{stats['max']} tokens (median "
              f"{stats['median']:.0f}), rows of {length}, batches of {batch}; pack, overflow truncate, "
              "shuffle on (the defaults) ==", flush=True)
        rounds: list[dict] = []
        for index in range(args.rounds):
            order = entries[index % len(entries):] + entries[:index % len(entries)]
            load = os.getloadavg()[0]
            results = {label: run_child(tree, pipeline, files, length, batch, args) for label, tree, pipeline in order}
            rounds.append(results)
            print(f"  round {index + 1} (load average {load:.2f} → {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores): "
                  + ", ".join(f"{label} {results[label]['tok_s'] / 1e6:.2f} M tok/s, {results[label]['ms_1k']:.4f} ms "
                              f"CPU/1k" for label, _, _ in entries), flush=True)
        labels = [label for label, _, _ in entries]

        def ratios(a: str, b: str, field: str) -> list[float]:
            return [r[a][field] / r[b][field] for r in rounds]

        print(f"  {'pipeline':22s} {'non-pad':>7s} {'M tok/s':>19s} {'CPU ms / 1k tok':>25s} | "
              f"{'tok/s ÷ ' + theirs_name:>22s} {'tok/CPU-s ÷ ' + theirs_name:>24s} | {'tok/s ÷ seqio':>22s} "
              f"{'tok/CPU-s ÷ seqio':>22s}")
        for label in labels:
            row = (f"  {label:22s} {statistics.median(r[label]['fill'] for r in rounds):7.3f} "
                   f"{spread([r[label]['tok_s'] / 1e6 for r in rounds]):>19s} "
                   f"{spread([r[label]['ms_1k'] for r in rounds], 4):>25s} | ")
            row += (f"{spread(ratios(label, theirs_name, 'tok_s')):>22s} {spread(ratios(label, theirs_name, 'tok_cpu_s')):>24s}"
                    if label != theirs_name else f"{'-':>22s} {'-':>24s}")
            row += (f" | {spread(ratios(label, SEQIO, 'tok_s')):>22s} {spread(ratios(label, SEQIO, 'tok_cpu_s')):>22s}"
                    if have_seqio and label != SEQIO else f" | {'-':>22s} {'-':>22s}")
            print(row, flush=True)
        summary.append((workload, rounds))
    print(f"\nsummary: {ours_name} ÷ {theirs_name} and ÷ seqio, median (worst–best) over {args.rounds} rounds")
    print(f"  {'workload':10s} {'non-pad ours/theirs' + ('/seqio' if have_seqio else ''):>26s} "
          f"{'tok/CPU-s ÷ ' + theirs_name:>24s} {'tok/s ÷ ' + theirs_name:>22s}"
          + (f" {'tok/s ÷ seqio':>22s} {'tok/CPU-s ÷ seqio':>22s}" if have_seqio else ""))
    for workload, rounds in summary:
        fills = "/".join(f"{statistics.median(r[label]['fill'] for r in rounds):.3f}" for label, _, _ in entries)
        line = (f"  {workload:10s} {fills:>26s} {spread([r[ours_name]['tok_cpu_s'] / r[theirs_name]['tok_cpu_s'] for r in rounds]):>24s} "
                f"{spread([r[ours_name]['tok_s'] / r[theirs_name]['tok_s'] for r in rounds]):>22s}")
        if have_seqio:
            line += (f" {spread([r[ours_name]['tok_s'] / r[SEQIO]['tok_s'] for r in rounds], 1):>22s}"
                     f" {spread([r[ours_name]['tok_cpu_s'] / r[SEQIO]['tok_cpu_s'] for r in rounds], 1):>22s}")
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"ours": ours_name, "theirs": theirs_name, "workloads": dict(summary)}, handle, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per pipeline per round")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds pulled after the first batch, untimed")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--skip", default="",
                        help="comma-separated pipelines to leave out (a name with a comma too: \"pack, batched\")")
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--report", default=None, help="print the tables of a --json file again; measure nothing")
    parser.add_argument("--against", default=None, metavar="TREE",
                        help="a checkout of another commit (git worktree add /tmp/aa97487 aa97487): our pack mode, "
                             "that tree's and seqio's, each in a process of its own, side by side (pack_child.py)")
    args = parser.parse_args()
    if args.against:
        against(args)
        return
    if args.report:
        with open(args.report) as handle:
            for result in json.load(handle):
                print_header(result)
                print_table(result)
        return
    seqio_utils = import_seqio_utils()
    if seqio_utils is None:
        print(f"seqio is not installed ({sys.executable} -m pip install --no-deps seqio): no seqio column")
    print(f"TF {tf.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds, {args.warmup} s warm-up + ~{args.seconds} s timed per pipeline per round")
    results = []
    for workload in args.workloads.split(","):
        results.append(bench_workload(workload, args, seqio_utils))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
