"""`tpu-pipeline convert`: real data → sharded TFRecords + metadata.json, in one command.

    tpu-pipeline convert --from image-folder path/to/images/ --out gs://bucket/ds/ --splits train=0.9,validation=0.1
    tpu-pipeline convert --from csv data.csv --out ds/
    tpu-pipeline convert --from numpy arrays.npz --out ds/
    tpu-pipeline convert --from tfds mnist --data_dir ~/tensorflow_datasets --out ds/
    tpu-pipeline convert --from text corpus/*.txt --out ds/ --splits train=0.95,validation=0.05 [--tokenizer spm:m.model]
    tpu-pipeline convert --from parquet path/to/dataset --text_field text --out ds/     # the hub's Parquet layout
    tpu-pipeline convert --from parquet path/to/dataset --image_field image --label_field label --out ds/
    tpu-pipeline convert --from hf path/to/saved_dataset --text_field text --out ds/     # datasets' save_to_disk
    tpu-pipeline convert --from chat chats.jsonl --out ds/ [--chat_template chatml|gemma|tokenizer_config.json] \\
        [--tokenizer hf:tokenizer.json] [--max_conversation_tokens 2048]   # or a Parquet / save_to_disk folder

--from parquet and --from hf take the splits from the layout (data/train-00000-of-00004.parquet, a split
folder, the README.md's configs, save_to_disk's dataset_dict.json) and read with pyarrow, a row group per
task, in parallel.

Then point a config at the result: `data.source: {type: tfrecord, dir: ds/, split: train}`.
Running the same command again after an interruption finishes the work.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from absl import flags

from tpu_pipeline.commands import _common  # noqa: F401  (defines --workers, shared with verify)
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.records.convert import ConvertOptions, ConvertSource, convert

SOURCES = ("image-folder", "csv", "numpy", "tfds", "text", "parquet", "hf", "chat")
TABLES = ("parquet", "hf")
# Flags of one group of sources only: naming one with another --from is an error, not ignored.
ONLY = {
    "document_per_line": ("text",), "tokenizer": ("text", *TABLES, "chat"), "text_field": ("text", *TABLES),
    "ids_field": ("text", *TABLES), "vocab_size": ("text", *TABLES),
    "image_field": TABLES, "label_field": TABLES, "keep_fields": TABLES, "hf_config": (*TABLES, "chat"),
    "shuffle_window_mb": (*TABLES, "chat"), "chat_template": ("chat",), "loss_on": ("chat",),
    "max_conversation_tokens": ("chat",), "overlong": ("chat",), "max_record_tokens": ("text", *TABLES),
}

# 'from' is a Python keyword: the flag is read as FLAGS["from"].value.
flags.DEFINE_enum("from", None, list(SOURCES), "what the input is: an image folder (one sub-folder per class), "
                  "a CSV file with a header, a .npz file, the name of a prepared TFDS dataset, text files "
                  "(.txt, or .jsonl with --text_field/--ids_field; several paths, quoted globs and directories), "
                  "Parquet files (a file, a quoted glob, or a folder in the Hugging Face hub's layout), hf: a folder "
                  "written by datasets' save_to_disk, or chat: conversations (messages, prompt/completion or "
                  "question/answer) in JSON lines, Parquet or a save_to_disk folder")
flags.DEFINE_string("out", None, "output directory for the shards and metadata.json (local or gs://)")
flags.DEFINE_string("data_dir", None, "tfds: the data_dir where the dataset is prepared")
flags.DEFINE_string("splits", None, "image-folder/csv/numpy/text: 'train' or fractions 'train=0.9,validation=0.1' "
                    "(default train); tfds, parquet, hf: 'train,test' or 'train,validation=test' (default: every split), "
                    "or fractions of a dataset of one split")
flags.DEFINE_float("target_shard_mb", 150.0, "target shard size in MB (the TFRecord guidance: 100-200 MB)")
flags.DEFINE_integer("min_shards", 8, "never fewer shards per split than this (at least one per host reading them)")
flags.DEFINE_enum("compression", "none", ["none", "GZIP", "ZLIB"], "TFRecord compression", case_sensitive=False)
flags.DEFINE_enum("on_error", "raise", ["raise", "skip"], "an unreadable image or row: stop (raise) or skip it, "
                  "counting and listing it in metadata.json")
flags.DEFINE_enum("reencode", "none", ["none", "jpeg", "png"], "image-folder/numpy: re-encode images "
                  "(default: keep the original bytes)")
flags.DEFINE_integer("jpeg_quality", 95, "quality for --reencode=jpeg")
flags.DEFINE_boolean("overwrite", False, "replace a finished dataset (or stray shards) already in --out")
flags.DEFINE_integer("seed", 0, "seed of the example order and of the split assignment")
flags.DEFINE_boolean("shuffle", True, "shuffle the examples before sharding (an image folder lists one class after another)")
flags.DEFINE_string("label_column", "label", "csv/numpy: the label column or array (string labels become class ids)")
flags.DEFINE_list("class_names", None, "csv/numpy/parquet/hf: class names in id order (default: datasets' ClassLabel "
                  "names, else the sorted distinct string labels)")
flags.DEFINE_string("columns", None, "csv: column types, e.g. 'age:int64,height:float32,city:string' (default: inferred)")
flags.DEFINE_list("features", None, "tfds: the features to keep (default: all)")
flags.DEFINE_string("tokenizer", "bytes", "text/chat: 'bytes' (UTF-8 bytes + 3, 259 ids; chat adds its template's "
                    "special tokens after them), 'spm:path/to/sentencepiece.model' (copied into --out as tokenizer.model) "
                    "or 'hf:path/to/tokenizer.json' (a Hugging Face tokenizer, copied as tokenizer.json)")
flags.DEFINE_string("chat_template", "chatml", "chat: the chat template: chatml, gemma, a tokenizer_config.json (or its "
                    "folder) with a chat_template, or a .jinja file")
flags.DEFINE_enum("loss_on", "answers", ["answers", "all"], "chat: the tokens trained on: the assistant's answers and "
                  "their end-of-turn tokens (the weights inside the tokens: weighted_tokens), or all of them (plain "
                  "tokens)")
flags.DEFINE_integer("max_conversation_tokens", 65_536, "chat: a longer conversation loses its oldest exchanges whole "
                     "(--overlong truncate) or is dropped (--overlong drop); both are counted. Set it to your "
                     "data.sequence.length so that no conversation is cut in a row")
flags.DEFINE_enum("overlong", "truncate", ["truncate", "drop"], "chat: what happens to a conversation over "
                  "--max_conversation_tokens: drop its oldest exchanges (never cutting a turn; the system message "
                  "stays) until it fits, or drop it")
flags.DEFINE_boolean("document_per_line", False, "text: each line of a .txt file is a document (default: each file)")
flags.DEFINE_string("text_field", None, "text: read JSON lines (.jsonl/.json), the document being this field's "
                    "string; parquet/hf: the string column to tokenize")
flags.DEFINE_string("ids_field", None, "text: read JSON lines whose field holds pre-tokenized ids (a list of ints); "
                    "parquet/hf: a column of lists of ints; needs --vocab_size")
flags.DEFINE_string("image_field", None, "parquet/hf: the column of encoded images (datasets' Image: {bytes, path}; "
                    "or binary), stored as the original bytes")
flags.DEFINE_string("label_field", None, "parquet/hf: the label column: ints (class ids; names from datasets' "
                    "ClassLabel) or strings (made class ids, sorted, names in metadata.json)")
flags.DEFINE_list("keep_fields", [], "parquet/hf: more scalar columns to keep as features, under their own names")
flags.DEFINE_string("hf_config", None, "parquet/hf: the config of a hub dataset with several (README.md configs, "
                    "or one folder per config)")
flags.DEFINE_float("shuffle_window_mb", 256.0, "parquet/hf: rows are shuffled within windows of row groups holding "
                   "about this much data (memory: about twice this, plus a row group per worker)")
flags.DEFINE_integer("vocab_size", None, "text with --ids_field: every id must lie in [0, vocab_size)")
flags.DEFINE_integer("max_record_tokens", 65_536, "text: a longer document is written as consecutive records "
                     "of at most this many tokens (EOS only at its end), so reading one costs bounded memory; "
                     "0: one record per document")
flags.DEFINE_boolean("progress", True, "show a progress bar")
FLAGS = flags.FLAGS


def make_source(kind: str, target: str, more: Sequence[str] = ()) -> ConvertSource:
    """The source for --from, built from the flags (each module imported only when used)."""
    reencode = "" if FLAGS.reencode == "none" else FLAGS.reencode
    if kind in TABLES:
        from tpu_pipeline.records.table_input import TableSource

        return TableSource(
            target, kind=kind, config=FLAGS.hf_config, splits=FLAGS.splits, seed=FLAGS.seed, shuffle=FLAGS.shuffle,
            text_field=FLAGS.text_field, ids_field=FLAGS.ids_field, vocab_size=FLAGS.vocab_size,
            tokenizer=FLAGS.tokenizer, max_record_tokens=FLAGS.max_record_tokens, image_field=FLAGS.image_field,
            label_field=FLAGS.label_field, keep_fields=FLAGS.keep_fields, class_names=FLAGS.class_names,
            shuffle_window_mb=FLAGS.shuffle_window_mb,
        )
    if kind == "chat":
        from tpu_pipeline.records.chat_input import chat_source

        return chat_source(
            [target, *more], template=FLAGS.chat_template, tokenizer=FLAGS.tokenizer, loss_on=FLAGS.loss_on,
            max_tokens=FLAGS.max_conversation_tokens, overlong=FLAGS.overlong, splits=FLAGS.splits, seed=FLAGS.seed,
            shuffle=FLAGS.shuffle, hf_config=FLAGS.hf_config, shuffle_window_mb=FLAGS.shuffle_window_mb,
        )
    splits = FLAGS.splits or "train"
    if kind == "text":
        from tpu_pipeline.records.text_input import TextSource

        return TextSource(
            [target, *more], splits=splits, seed=FLAGS.seed, shuffle=FLAGS.shuffle, tokenizer=FLAGS.tokenizer,
            document_per_line=FLAGS.document_per_line, text_field=FLAGS.text_field, ids_field=FLAGS.ids_field,
            vocab_size=FLAGS.vocab_size, max_record_tokens=FLAGS.max_record_tokens,
        )
    if kind == "image-folder":
        from tpu_pipeline.records.image_folder import ImageFolderSource

        return ImageFolderSource(target, splits, FLAGS.seed, FLAGS.shuffle, reencode, FLAGS.jpeg_quality)
    tabular: dict[str, Any] = dict(
        splits=splits, seed=FLAGS.seed, shuffle=FLAGS.shuffle, label_column=FLAGS.label_column,
        require_label=FLAGS["label_column"].present, class_names=FLAGS.class_names,
    )
    if kind == "csv":
        from tpu_pipeline.records.csv_input import CsvSource, parse_columns

        return CsvSource(target, columns=parse_columns(FLAGS.columns) if FLAGS.columns else None, **tabular)
    if kind == "numpy":
        from tpu_pipeline.records.numpy_input import NumpySource

        return NumpySource(target, reencode=reencode, jpeg_quality=FLAGS.jpeg_quality, **tabular)
    from tpu_pipeline.records.tfds_reader import TFDSConvertSource

    return TFDSConvertSource(target, FLAGS.data_dir, FLAGS.splits, FLAGS.features)


def run(overrides: Sequence[str]) -> int:
    kind = FLAGS["from"].value
    if kind is None:
        raise ConfigError(f"--from is required: one of {', '.join(SOURCES)}")
    for name, kinds in ONLY.items():
        if FLAGS[name].present and kind not in kinds:
            raise ConfigError(f"--{name}: only with --from {' or '.join(kinds)}")
    if kind in ("text", "chat") and not overrides:
        raise ConfigError(f"--from {kind} needs at least one input: .{'txt/.' if kind == 'text' else ''}jsonl files, "
                          "quoted globs or directories" + (", or a Parquet / save_to_disk folder" if kind == "chat" else ""))
    if len(overrides) != 1 and kind not in ("text", "chat"):
        what = "the TFDS dataset name" if kind == "tfds" else "the dataset's folder" if kind in TABLES else "the input path"
        raise ConfigError(f"convert takes exactly one positional argument, {what} (given: {list(overrides)})")
    if not FLAGS.out:
        raise ConfigError("--out is required: the directory to write the shards and metadata.json to")
    options = ConvertOptions(
        target_shard_mb=FLAGS.target_shard_mb, min_shards=FLAGS.min_shards,
        compression="" if FLAGS.compression.lower() == "none" else FLAGS.compression.upper(),
        on_error=FLAGS.on_error, workers=FLAGS.workers, overwrite=FLAGS.overwrite, progress=FLAGS.progress,
    )
    if kind == "image-folder" and "://" not in FLAGS.out + overrides[0]:
        inside = os.path.abspath(os.path.expanduser(FLAGS.out)) + os.sep
        if inside.startswith(os.path.abspath(os.path.expanduser(overrides[0])).rstrip(os.sep) + os.sep):
            raise ConfigError("--out must not be inside the image folder: its sub-folders are the classes")
    source = make_source(kind, overrides[0], overrides[1:])
    result = convert(source, FLAGS.out, options)
    print(summary(result.metadata, result.out_dir, result.shards_written, result.shards_reused, result.already_complete))
    return 0


def interrupted() -> str:
    """What a Ctrl-C left in --out (the CLI prints it as one line): the finished shards, kept for the
    same command to reuse; a half-written shard is a temporary file that the next run deletes."""
    from tpu_pipeline.records.convert import interrupted_state

    if not FLAGS.out:
        return ""
    return interrupted_state(FLAGS.out)


def long_documents_line(metadata: dict[str, Any]) -> str:
    """One warning line for the documents far longer than any row (text datasets), or "" when none is."""
    from tpu_pipeline.records.text_input import LONG_DOCUMENT_TOKENS

    splits = {name: entry for name, entry in metadata["splits"].items() if entry.get("num_long_documents")}
    if not splits:
        return ""
    count = sum(entry["num_long_documents"] for entry in splits.values())
    where, longest = max(((name, entry.get("longest_document_tokens", 0)) for name, entry in splits.items()),
                         key=lambda pair: pair[1])
    parts = metadata.get("max_record_tokens") or 0
    stored = (f"each is stored as records of at most {parts:,} tokens, read as separate examples (no attention "
              "across them); " if parts and longest > parts else "")
    head = "each record's" if stored else "only its"
    return (f"  warning: {count:,} document(s) have more than {LONG_DOCUMENT_TOKENS:,} tokens (the longest "
            f"{longest:,}, in {where}); {stored}in training, data.sequence.overflow: split cuts each into chunks "
            "of data.sequence.length tokens, each its own segment (no attention across chunks), and overflow: "
            f"truncate keeps {head} first length tokens")


def chat_line(split: str, entry: dict[str, Any], megabytes: float) -> str:
    """A chat split: conversations, tokens, how many are trained on, and what --max_conversation_tokens did."""
    tokens = entry["num_tokens"]
    share = f" ({entry['num_weighted_tokens'] / tokens:.0%} trained on)" if tokens else ""
    line = (f"  {split}: {entry['num_conversations']:,} conversations, {tokens:,} tokens{share} in "
            f"{len(entry['files'])} shard(s), {megabytes:.1f} MB")
    cut = []
    if entry.get("num_truncated_conversations"):
        cut.append(f"{entry['num_truncated_conversations']:,} shortened by their oldest exchanges "
                   f"({entry['num_dropped_turns']:,} turns dropped)")
    if entry.get("num_dropped_long_conversations"):
        cut.append(f"{entry['num_dropped_long_conversations']:,} dropped whole")
    blank = f"; {entry['num_empty']:,} blank line(s) counted, not written" if entry.get("num_empty") else ""
    return line + ("; over --max_conversation_tokens: " + ", ".join(cut) if cut else "") + blank


def summary(metadata: dict[str, Any], out_dir: str, written: int, reused: int, already_complete: bool) -> str:
    """What was written, what was skipped, and the config lines that read it."""
    if already_complete:
        lines = [f"{out_dir} already holds this dataset (metadata.json); nothing to do."]
    else:
        lines = [f"wrote {written} shard(s)" + (f", kept {reused} from the interrupted run" if reused else "") + f" in {out_dir}"]
    for split, entry in metadata["splits"].items():
        megabytes = sum(entry["bytes"]) / 2**20
        if "num_conversations" in entry:
            lines.append(chat_line(split, entry, megabytes))
        elif "num_documents" in entry:
            empty = f"; {entry['num_empty']:,} empty document(s) counted, not written" if entry.get("num_empty") else ""
            parts = f" in {entry['num_examples']:,} records" if entry.get("num_split_documents") else ""
            lines.append(f"  {split}: {entry['num_documents']:,} documents{parts}, {entry['num_tokens']:,} tokens in "
                         f"{len(entry['files'])} shard(s), {megabytes:.1f} MB{empty}")
        else:
            lines.append(f"  {split}: {entry['num_examples']} examples in {len(entry['files'])} shard(s), {megabytes:.1f} MB")
        if entry.get("num_skipped"):
            lines.append(f"    skipped {entry['num_skipped']} unreadable item(s) (all listed in metadata.json):")
            lines += [f"      {s['where']}: {s['reason']}" for s in entry["skipped"][:20]]
            if entry["num_skipped"] > 20:
                lines.append(f"      ... and {entry['num_skipped'] - 20} more")
    long_line = long_documents_line(metadata)
    if long_line:
        lines.append(long_line)
    if metadata.get("class_names"):
        names = metadata["class_names"]
        lines.append(f"  classes ({len(names)}): {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}")
    tokenizer = metadata.get("tokenizer")
    if tokenizer:
        special = ", ".join(f"{name} {i}" for name, i in tokenizer["special_ids"].items()) or "none"
        lines.append(f"  tokenizer: {tokenizer['type']}, vocab_size {tokenizer['vocab_size']}, special ids: {special}"
                     + (f" (model copied to {tokenizer['model_file']})" if tokenizer.get("model_file") else ""))
    source = metadata.get("source") or {}
    if source.get("splits_from"):  # parquet/hf: how the layout gave the splits, and the files it left out
        ignored = source.get("num_ignored_files") or 0
        lines.append(f"  splits from {source['splits_from']}" + (f"; {ignored} file(s) named no split and were left "
                     f"out (e.g. {source['ignored_files'][0]}; listed in metadata.json)" if ignored else ""))
    split = "train" if "train" in metadata["splits"] else next(iter(metadata["splits"]))
    if tokenizer:
        features = ", ".join(f"{name}: {{{', '.join(f'{k}: {v}' for k, v in spec.items())}}}"
                             for name, spec in metadata["features"].items())
        key = (metadata.get("chat") or {}).get("feature")  # a chat set: each token 2 * id + weight
        shift = f", preprocess: [{{op: lm_shift, key: {key}}}]" if key else ""
        lines.append(f"read it with:  data: {{source: {{type: tfrecord, dir: {out_dir}, split: {split}}}, "
                     f"features: {{{features}}}{shift}}}")
        return "\n".join(lines)
    lines.append(f"read it with:  data.source: {{type: tfrecord, dir: {out_dir}, split: {split}}}")
    return "\n".join(lines)
