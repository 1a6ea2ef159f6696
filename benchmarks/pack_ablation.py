"""Where commit 022e026's pack mode lost its speed: its `PackRows` with one part at a time put back as
aa97487 had it (issue 37, item 1). Runs ONLY against a worktree of 022e026 (it replaces that commit's
`PackRows.apply` and `Batch.apply`); each line is one process:

    git worktree add /tmp/head 022e026
    F="$HOME/.cache/tpu_pipeline/bench/seq_docs/train-*.tfrecord"       # bench_sequences.py makes it
    for parts in "" nopool rows_rebatched nochunk nochunk,nopool,rows_rebatched; do
      PYTHONPATH=/tmp/head PARTS=$parts .venv/bin/python benchmarks/pack_ablation.py "$F" 256 32 3
    done
    PYTHONPATH=/tmp/aa97487 .venv/bin/python benchmarks/pack_ablation.py "$F" 256 32 3    # as it was
    PYTHONPATH=. .venv/bin/python benchmarks/pack_ablation.py "$F" 1024 64 3 '{"row_shuffle": 1}'   # this tree

PARTS (comma-separated) puts back:
  nochunk         no chunk pass: each example is its own chunk (right only where no example is longer
                  than a row, as in seq_docs@256)
  nopool          rows leave in packing order, one window at a time (no ragged batch of windows, no gather)
  rows_rebatched  the Batch cuts its batches from the packer's blocks of rows (`rebatch`) instead of
                  taking one row an element (`unbatch`, then `batch`)
With no PARTS (or another tree on PYTHONPATH) the pipeline is the tree's own. A fifth argument (JSON)
adds data.sequence keys to the config. Prints one JSON line:
real tokens per second and CPU ms (this process, all threads) per 1,000 real tokens over ~SECONDS.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402

PARTS = set(filter(None, os.environ.get("PARTS", "").split(",")))


def patch_022e026() -> None:
    """022e026's PackRows.apply with PARTS put back (its own code otherwise, line for line)."""
    from tpu_pipeline.pipeline import chunking, seeds, sequence_stages, stages

    def apply(self, dataset, context):
        self.check_features(dataset.element_spec)
        keys = list(self.keys)
        if "nochunk" in PARTS:
            def whole(first, block):
                n = tf.cast(block[keys[0]].nrows(), tf.int64)
                return {**block, chunking.EXAMPLE: first + tf.range(n), chunking.CHUNK: tf.zeros([n], tf.int64)}
            numbered = dataset.scan(tf.constant(0, tf.int64),
                                    lambda s, b: (s + tf.cast(b[keys[0]].nrows(), tf.int64), (s, b)))
            chunks = numbered.map(whole)
        else:
            chunks = chunking.chunk_stream(dataset, keys, self.lengths, self.overflow, 0, 0, [])
        packer = dataclasses.replace(self._packer(), overflow="truncate")

        def pack(window):
            rows = packer.pack({key: window[key] for key in keys})
            return {**rows, chunking.EXAMPLE: window[chunking.EXAMPLE][0], chunking.CHUNK: window[chunking.CHUNK][0]}

        packed = chunks.rebatch(self.window).map(pack, num_parallel_calls=tf.data.AUTOTUNE)
        pools = 0 if "nopool" in PARTS else self.row_shuffle

        def pool(windows):
            batched = isinstance(windows[keys[0]], tf.RaggedTensor)
            rows = {key: value.values if batched else value for key, value in windows.items()
                    if key not in (chunking.EXAMPLE, chunking.CHUNK)}
            example, first = ((windows[chunking.EXAMPLE][0], windows[chunking.CHUNK][0]) if batched
                              else (windows[chunking.EXAMPLE], windows[chunking.CHUNK]))
            count = tf.shape(rows[keys[0]])[0]
            if pools:
                seed = seeds.key(self.seed, seeds.ROW_SHUFFLE, 0, example, first)
                order = tf.random.experimental.stateless_shuffle(tf.range(count), seed=seed)
                rows = {key: tf.gather(value, order) for key, value in rows.items()}
            return {**rows, **stages.position_fields(example, first, tf.range(count))}

        out = (packed.ragged_batch(pools) if pools > 1 else packed).map(pool)
        return out if "rows_rebatched" in PARTS else out.unbatch()

    sequence_stages.PackRows.apply = apply
    if "rows_rebatched" in PARTS:
        batch_apply = stages.Batch.apply

        def rebatched(self, dataset, context):
            if self.records:
                return batch_apply(self, dataset, context)
            return dataset.rebatch(self.size(context.input), drop_remainder=self.drop_remainder)

        stages.Batch.apply = rebatched


@tf.function
def consume(iterator, batches):
    real = tf.constant(0, tf.int64)
    for _ in tf.range(batches):
        real += tf.math.count_nonzero(next(iterator)["tokens_segment_ids"], dtype=tf.int64)
    return real


def main() -> None:
    files, length, batch, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sequence = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    if PARTS:
        patch_022e026()
    data = {"source": {"type": "tfrecord", "files": files}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": length, "mode": "pack", "overflow": "truncate",
                         **sequence},
            "batch_size": batch, "repeat": "forever"}
    iterator = iter(Pipeline.from_config(config_from_dict({"data": data}).data).build())
    consume(iterator, tf.constant(1, tf.int64))
    start, pulled = time.perf_counter(), 0
    while time.perf_counter() - start < 1.5:
        consume(iterator, tf.constant(8, tf.int64))
        pulled += 8
    batches = max(8, int(pulled / (time.perf_counter() - start) * seconds))
    process = psutil.Process()
    cpu, start = sum(process.cpu_times()[:2]), time.perf_counter()
    real = int(consume(iterator, tf.constant(batches, tf.int64)))
    elapsed, cpu = time.perf_counter() - start, sum(process.cpu_times()[:2]) - cpu
    import tpu_pipeline
    print(json.dumps({"tree": os.path.dirname(os.path.dirname(tpu_pipeline.__file__)), "parts": sorted(PARTS),
                      "sequence": sequence,
                      "M_tok_s": round(real / elapsed / 1e6, 2), "cpu_ms_per_1k": round(cpu / real * 1e6, 4)}),
          flush=True)


if __name__ == "__main__":
    main()
