"""`convert --from parquet` against its physical limits, side by side in one run.

    .venv/bin/python benchmarks/bench_convert_parquet.py                      # ~100 MB of text, 20 MB of images
    .venv/bin/python benchmarks/bench_convert_parquet.py --text_mb 300 --image_mb 100 --memory   # + peak RSS

Writes (once, under --dir) Parquet files in the hub's layout: `text/data/train-0000K-of-0000N.parquet`
holding documents of real English prose (paragraphs of the CPython documentation that ships with
Python, `pydoc_data.topics`, cut and recombined into documents of 1-20 paragraphs), row groups of
1,000 rows as `datasets` writes them; and `images/data/train-...` holding real JPEG bytes in datasets'
Image structs with a ClassLabel label. Then, on the same files:

  pyarrow read       every row group of the column read with pyarrow (ParquetFile.read_row_group), one
                     thread, then one per core: the rate no converter of these files can beat
  tokenizer encode   the byte-level tokenizer's own `encode` on every document (and SentencePiece's,
                     on a model trained here on the same text, when sentencepiece is installed), one
                     thread: the rate of tokenizing alone
  convert            `convert(TableSource(...))` into a fresh directory: 1 worker, then one per core
  --from text        the same documents as JSON lines through `convert --from text --text_field`,
                     a batch of documents per task (since issue 28), and a future per document (before)

Rates are MB/s of the column's bytes (text: UTF-8 bytes; images: encoded image bytes) and
documents (rows) per second, and per core: rate / threads used. Other work on the machine moves the
absolute figures; the load average is printed with them.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tpu_pipeline.format.tokenizer import ByteTokenizer, load_tokenizer  # noqa: E402
from tpu_pipeline.records import ConvertOptions, TextSource, convert  # noqa: E402
from tpu_pipeline.records.table_input import TableSource  # noqa: E402

ROWS_PER_GROUP = 1000
HF_IMAGE = json.dumps({"info": {"features": {"image": {"_type": "Image"},
                                             "label": {"names": ["a", "b", "c", "d"], "_type": "ClassLabel"}}}})


def paragraphs() -> list[str]:
    import pydoc_data.topics

    found = []
    for text in pydoc_data.topics.topics.values():
        found += [p for p in text.split("\n\n") if p.strip()]
    return found


def write_text(root: str, megabytes: float, files: int = 8) -> None:
    """Documents of 1-20 paragraphs, `megabytes` of UTF-8 in all, over `files` hub-named Parquet files."""
    pieces = paragraphs()
    rng = np.random.default_rng(0)
    docs, size = [], 0
    while size < megabytes * 1e6:
        doc = "\n\n".join(pieces[i] for i in rng.integers(0, len(pieces), size=int(rng.integers(1, 21))))
        docs.append(doc)
        size += len(doc.encode())
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    per_file = -(-len(docs) // files)
    for k in range(files):
        table = pa.table({"text": docs[k * per_file:(k + 1) * per_file]})
        pq.write_table(table, os.path.join(root, "data", f"train-{k:05d}-of-{files:05d}.parquet"),
                       row_group_size=ROWS_PER_GROUP)


def write_images(root: str, megabytes: float, files: int = 4) -> None:
    """Real JPEGs (64-160 px, noise over gradients) in datasets' Image structs, ClassLabel labels."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images, size = [], 0
    while size < megabytes * 1e6:
        h, w = (int(x) for x in rng.integers(64, 161, size=2))
        base = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * np.ones((h, 1, 3), np.float32)
        pixels = np.clip(base + rng.normal(0, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
        data = tf.io.encode_jpeg(pixels, quality=90).numpy()
        images.append(data)
        size += len(data)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    per_file = -(-len(images) // files)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for k in range(files):
        chunk = images[k * per_file:(k + 1) * per_file]
        table = pa.table({"image": pa.array([{"bytes": b, "path": None} for b in chunk], struct),
                          "label": pa.array([i % 4 for i in range(len(chunk))], pa.int64())})
        table = table.replace_schema_metadata({"huggingface": HF_IMAGE})
        pq.write_table(table, os.path.join(root, "data", f"train-{k:05d}-of-{files:05d}.parquet"), row_group_size=100)


def parquet_files(root: str) -> list[str]:
    folder = os.path.join(root, "data")
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".parquet")]


def read_rate(root: str, column: str, threads: int) -> tuple[float, int, int]:
    """Seconds to read every row group of `column` (pyarrow, `threads` at once), rows, column bytes."""
    groups = [(path, g) for path in parquet_files(root) for g in range(pq.ParquetFile(path).metadata.num_row_groups)]

    def read(job):
        path, group = job
        table = pq.ParquetFile(path).read_row_group(group, columns=[column], use_threads=False)
        values = table.column(0)
        if pa.types.is_struct(values.type):
            values = pa.chunked_array([c.field("bytes") for c in values.chunks])
        return table.num_rows, int(pc.sum(pc.binary_length(values)).as_py() or 0)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(read, groups))
    return time.perf_counter() - start, sum(r[0] for r in results), sum(r[1] for r in results)


def documents(root: str) -> list[str]:
    return [t for path in parquet_files(root) for t in pq.read_table(path, columns=["text"]).column(0).to_pylist()]


def encode_rate(tokenizer, docs: list[str]) -> float:
    start = time.perf_counter()
    for doc in docs:
        tokenizer.encode(doc)
    return time.perf_counter() - start


def timed_convert(source, workers: int) -> tuple[float, dict]:
    out = tempfile.mkdtemp(prefix="bench_convert_")
    try:
        start = time.perf_counter()
        result = convert(source, out, ConvertOptions(workers=workers, progress=False))
        return time.perf_counter() - start, result.metadata
    finally:
        shutil.rmtree(out, ignore_errors=True)


def train_spm(docs: list[str], directory: str) -> str:
    import sentencepiece as spm

    sample = os.path.join(directory, "spm_sample.txt")
    with open(sample, "w") as handle:
        handle.write("\n".join(docs[:2000]))
    prefix = os.path.join(directory, "bench_spm")
    spm.SentencePieceTrainer.train(input=sample, model_prefix=prefix, vocab_size=4000, model_type="unigram", hard_vocab_limit=False,
                                   minloglevel=2, num_threads=2, input_sentence_size=200_000,
                                   shuffle_input_sentence=True)
    return prefix + ".model"


RSS_CHILD = """
import sys
from tpu_pipeline.cli import main
try:
    main(["tpu-pipeline", "convert", *sys.argv[1:], "--noprogress"])
except SystemExit as stop:
    assert not stop.code, stop.code
# VmHWM: this process's peak resident set (ru_maxrss would count the parent's, inherited at fork)
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0], file=sys.stderr)
"""


def peak_rss(args: list[str]) -> float:
    """Peak resident memory (MB) of `tpu-pipeline convert ARGS` in a child process of its own."""
    result = subprocess.run([sys.executable, "-c", RSS_CHILD, *args], check=True, capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return int(result.stderr.strip().splitlines()[-1]) / 1024


def row(name: str, seconds: float, megabytes: float, rows: int, threads: int) -> str:
    return (f"| {name} | {threads} | {seconds:.2f} | {megabytes / seconds:.1f} | {megabytes / seconds / threads:.1f} | "
            f"{rows / seconds:,.0f} | {rows / seconds / threads:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "bench_convert_parquet"))
    parser.add_argument("--text_mb", type=float, default=100)
    parser.add_argument("--image_mb", type=float, default=20)
    parser.add_argument("--memory", action="store_true", help="also the peak RSS of CLI converts (child processes)")
    parser.add_argument("--no_text_converter", action="store_true", help="skip the --from text JSON-lines row")
    options = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    text_root = os.path.join(options.dir, f"text{options.text_mb:g}")
    image_root = os.path.join(options.dir, f"images{options.image_mb:g}")
    if not os.path.isdir(text_root):
        write_text(text_root, options.text_mb)
    if not os.path.isdir(image_root):
        write_images(image_root, options.image_mb)
    print(f"cores: {cores}; load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    docs = documents(text_root)
    text_mb = sum(len(d.encode()) for d in docs) / 1e6
    on_disk = sum(os.path.getsize(p) for p in parquet_files(text_root)) / 1e6
    print(f"text: {len(docs):,} documents, {text_mb:.1f} MB of UTF-8 in {len(parquet_files(text_root))} files "
          f"({on_disk:.1f} MB of Parquet, snappy), row groups of {ROWS_PER_GROUP:,} rows")
    print("\n| text | threads | seconds | MB/s | MB/s per core | documents/s | documents/s per core |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for threads in sorted({1, cores}):
        seconds, rows, size = read_rate(text_root, "text", threads)
        print(row("pyarrow read of the column", seconds, size / 1e6, rows, threads))
    print(row("byte tokenizer encode", encode_rate(ByteTokenizer(), docs), text_mb, len(docs), 1))
    model = None
    try:
        model = train_spm(docs, options.dir)
        spm_seconds = encode_rate(load_tokenizer(f"spm:{model}"), docs)
        print(row("SentencePiece encode (4k unigram)", spm_seconds, text_mb, len(docs), 1))
    except ImportError:
        print("| SentencePiece | not installed | | | | | |")
    for workers in sorted({1, cores}):
        seconds, _ = timed_convert(TableSource(text_root, text_field="text"), workers)
        print(row("convert --from parquet, bytes", seconds, text_mb, len(docs), workers))
    if model:
        seconds, _ = timed_convert(TableSource(text_root, text_field="text", tokenizer=f"spm:{model}"), cores)
        print(row("convert --from parquet, SentencePiece", seconds, text_mb, len(docs), cores))
    if not options.no_text_converter:
        jsonl = os.path.join(options.dir, f"text{options.text_mb:g}.jsonl")
        if not os.path.exists(jsonl):
            with open(jsonl, "w") as handle:
                for doc in docs:
                    handle.write(json.dumps({"text": doc}) + "\n")
        seconds, _ = timed_convert(TextSource([jsonl], text_field="text"), cores)
        print(row("convert --from text (JSON lines), bytes, a batch of documents per task", seconds, text_mb,
                  len(docs), cores))
        one_by_one = TextSource([jsonl], text_field="text")
        one_by_one.encode_stream = None  # the converter's per-item path: a future per document, as before issue 28
        seconds, _ = timed_convert(one_by_one, cores)
        print(row("convert --from text (JSON lines), bytes, a future per document", seconds, text_mb, len(docs), cores))

    count = sum(pq.ParquetFile(p).metadata.num_rows for p in parquet_files(image_root))
    print(f"\nimages: {count:,} JPEGs in {len(parquet_files(image_root))} files, row groups of 100 rows")
    print("\n| images | threads | seconds | MB/s | MB/s per core | images/s | images/s per core |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    image_mb = 0.0
    for threads in sorted({1, cores}):
        seconds, rows, size = read_rate(image_root, "image", threads)
        image_mb = size / 1e6
        print(row("pyarrow read of the column", seconds, image_mb, rows, threads))
    for workers in sorted({1, cores}):
        seconds, _ = timed_convert(TableSource(image_root, image_field="image", label_field="label"), workers)
        print(row("convert --from parquet, image + label", seconds, image_mb, count, workers))
    if options.memory:
        out = tempfile.mkdtemp(prefix="bench_convert_rss_")
        first = parquet_files(text_root)[0]
        text = ["--text_field", "text"]
        try:
            runs = [
                (f"text, one file ({os.path.getsize(first) / 1e6:.0f} MB of Parquet)", [first, *text]),
                (f"text, all {text_mb:.0f} MB, --shuffle_window_mb 16", [text_root, *text, "--shuffle_window_mb", "16"]),
                (f"text, all {text_mb:.0f} MB, --shuffle_window_mb 256 (the default)", [text_root, *text]),
                (f"text, all {text_mb:.0f} MB, --noshuffle", [text_root, *text, "--noshuffle"]),
                (f"images, all {image_mb:.0f} MB", [image_root, "--image_field", "image", "--label_field", "label"]),
            ]
            print("\n| peak RSS of `tpu-pipeline convert --from parquet` (a process each; TensorFlow loaded) | MB |")
            print("|---|---:|")
            for number, (name, args) in enumerate(runs):
                print(f"| {name} | {peak_rss(['--from', 'parquet', *args, '--out', f'{out}/{number}']):,.0f} |")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
