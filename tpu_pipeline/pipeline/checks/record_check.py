"""Checking TFRecord files record by record, locating every fault: what `verify` runs on every file,
and what `train` runs to name the file and record behind a data error.

Per record: framing and both CRCs (`record_scan`, which goes on after a bad data CRC), the record
against the feature spec (`format.example_check`, the same check the pipeline makes on one record
at build time), the label against the class count where it is known, token features (integer ids
of kind ragged or sequence) against their vocabulary and for emptiness, and the deterministic
preprocessing ops one by one (so a failure names its op: a JPEG that does not decode). Per file:
its record count against metadata.json. Random ops are left out: they are not the data's fault.

A file's token ids must fit the model's vocabulary and its dataset's tokenizer (`vocabularies`: which
vocabulary each is), the smaller where both are known; with none known, only negative ids are faults.
A chat dataset's records (metadata.json `chat`) have their loss mask checked against their tokens
(`chat_check`), and any config's `loss_weights` are checked to be 0 or 1; weights are no token ids.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS, DataConfig
from tpu_pipeline.format.example_check import (Record as Proto, context_features, is_token_feature, misfit,
                                                parse_record, token_ids)
from tpu_pipeline.format.sniff import file_hint
from tpu_pipeline.format.vocabulary import Vocabulary, checked_vocabulary
from tpu_pipeline.ops import build_ops
from tpu_pipeline.pipeline.checks.chat_check import DatasetChats, chat_fault, chat_note
from tpu_pipeline.pipeline.checks.record_scan import FramingFault, Record, scan_records
from tpu_pipeline.pipeline.stages.parse import make_parser

FIXES = {
    "truncated": "the file was cut short (an interrupted copy or write): copy or convert it again",
    "bad_length_crc": "the framing is damaged: copy or convert the file again; the records after this one cannot be read",
    "bad_data_crc": "the record's bytes are corrupted: copy or convert the file again",
    "unreadable": "check data.source.compression, or copy the file again",
    "not_an_example": "was the file written by something else (raw bytes, another proto)?",
    "op_failed": "the bytes do not decode as the op expects: re-encode the source item and convert again",
    "label_out_of_range": "fix the label, or set train.num_classes to the real number of classes",
    "count_mismatch": "the file differs from what metadata.json lists: convert the dataset again, or restore the file",
    "empty_file": "the file holds no record: remove it from the glob, or write it again",
    "empty_document": "leave empty texts out when converting (data.on_error: skip leaves them out), or set "
                      "default: [] on the feature if empty documents are meant",
    "token_out_of_vocab": "token ids are 0..vocab_size-1 (a -1 is often padding written into the record): convert "
                      "again with the right tokenizer, without padding",
}


TAIL_KINDS = ("truncated", "bad_length_crc", "unreadable")  # nothing after these can be read


@dataclasses.dataclass(frozen=True)
class Fault:
    file: str
    record: Optional[int]  # None for a fault of the whole file
    offset: Optional[int]  # byte offset of the record's header
    kind: str
    what: str
    fix: str

    def line(self) -> str:
        """One line: where, what is wrong, and the fix."""
        where = self.file if self.record is None else f"{self.file}, record {self.record}"
        if self.offset is not None:
            where += f" (byte {self.offset:,})"
        return f"{where}: {self.what}; {self.fix}"


def count_by_kind(faults: Sequence[Fault]) -> dict[str, int]:
    """Faults per kind, kinds in name order (for tables and metrics.json)."""
    return dict(sorted(collections.Counter(fault.kind for fault in faults).items()))


@dataclasses.dataclass
class Report:
    section: str
    files: int = 0
    records: int = 0  # records framed (read), good or bad
    faults: list[Fault] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # what was (not) checked, said once

    def by_kind(self) -> dict[str, int]:
        return count_by_kind(self.faults)

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "files": self.files, "records": self.records, "faults_by_kind": self.by_kind(),
                "faults": [dataclasses.asdict(f) for f in self.faults], "notes": list(self.notes)}

    def table(self, limit: int = 40) -> str:
        head = f"{self.section}: {self.records:,} records in {self.files} file(s): "
        notes = [f"{self.section}: {note}" for note in self.notes]
        if not self.faults:
            return "\n".join([head + "no fault found", *notes])
        kinds = ", ".join(f"{kind} {count}" for kind, count in self.by_kind().items())
        lines = [head + f"{len(self.faults)} fault(s) ({kinds})", *notes,
                 "file | record | offset | what is wrong | fix"]
        for fault in self.faults[:limit]:
            record = "-" if fault.record is None else str(fault.record)
            offset = "-" if fault.offset is None else f"{fault.offset:,}"
            lines.append(f"{fault.file} | {record} | {offset} | {fault.what} | {fault.fix}")
        if len(self.faults) > limit:
            lines.append(f"... and {len(self.faults) - limit} more (write them all with --json)")
        return "\n".join(lines)


def label_key(config: DataConfig, features: dict[str, Any]) -> Optional[str]:
    outputs = config.outputs
    target = getattr(outputs, "targets", None) if outputs is not None else None
    if isinstance(target, str) and target in features:
        return target
    return "label" if "label" in features else None


_DATA_MARKS = ("record at", "Could not parse", "image file format", "Feature:", "expected to contain", "Invalid JPEG",
               "jpeg", "Name:", "Key:")


def tf_message(error: BaseException, limit: int = 200, marks: Sequence[str] = _DATA_MARKS) -> str:
    """TF's telling line (the first holding one of `marks`, else the first) without its graph-node
    prefix and op suffix: `Unknown image file format. ...`."""
    noise = ("Graph execution error", "Detected at node", "most recent call last", "File \"", "[[{{node")
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not any(mark in line for mark in noise) and not line.strip().startswith("<")]
    telling = [line for line in lines if any(mark in line for mark in marks)]
    text = (telling or lines or [type(error).__name__])[0]
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(error).__name__
    text = "".join(ch if ch.isprintable() else "?" for ch in text)  # parse errors quote the raw bytes
    return text if len(text) <= limit else text[:limit - 3] + "..."


class FileChecker:
    """Everything about one config that checking a record needs, built once and shared by threads."""

    def __init__(self, config: DataConfig, prefix: str, features: dict[str, Any], num_classes: Optional[int],
                 vocab: Optional[Vocabulary] = None, vocabularies: Optional[Mapping[str, Optional[Vocabulary]]] = None
                 ) -> None:
        """`vocab`: the config's (`config_vocabulary`); `vocabularies`: each file's own, from its dataset's
        metadata.json (`dataset_vocabularies`); a file's ids are checked against both (`checked_vocabulary`)."""
        self.features = features
        self.tokens = {name: feature for name, feature in features.items()
                       if is_token_feature(feature) and name != LOSS_WEIGHTS}  # weights are no ids
        self.vocab = vocab
        self.vocabularies = dict(vocabularies or {})
        self.chats = DatasetChats()  # each file's dataset's metadata.json `chat` entry, read on first use
        self.parse = make_parser(features)  # what the pipeline runs, SequenceExamples and int32 ids included
        fns, random = build_ops(config.preprocess, f"{prefix}.preprocess")
        self.ops = [(f"{prefix}.preprocess[{i}] ({op.op})", fn)
                    for i, (op, fn, is_random) in enumerate(zip(config.preprocess, fns, random)) if not is_random]
        self.label_key = label_key(config, features)
        self.num_classes = num_classes

    def vocabulary(self, path: str) -> Optional[Vocabulary]:
        """The bound of `path`'s token ids: the smaller of the model's vocabulary (the config's) and its
        dataset's tokenizer, where known (`format.vocabulary.checked_vocabulary`); None when neither is."""
        return checked_vocabulary(self.vocab, self.vocabularies.get(path))

    def vocabulary_note(self, files: Sequence[str]) -> Optional[str]:
        """What verify says once about token ids: the vocabulary they were checked against, or that none is known."""
        if not self.tokens:
            return None
        keys = ", ".join(repr(name) for name in self.tokens)
        known = sorted({(v.size, v.origin) for v in map(self.vocabulary, files) if v is not None})
        said = ", ".join(f"vocab_size {size} ({origin})" for size, origin in known)
        unknown = sum(self.vocabulary(path) is None for path in files)
        if not unknown:
            return f"token ids of {keys} checked against {said}"
        where = f"in {unknown} of {len(files)} file(s) (the others against {said})" if known else ""
        return (f"token ids of {keys} not checked against a vocabulary{where and ' ' + where}: none is known (set "
                "model.transformer.vocab_size, or convert with a tokenizer that metadata.json records); negative "
                "ids and empty documents are checked")

    def chat_note(self, files: Sequence[str]) -> Optional[str]:
        """What verify says once about the loss masks of chat data among `files` (`chat_check.chat_note`)."""
        return chat_note([self.chats(path) for path in files])

    def token_fault(self, path: str, record: Record, example: Proto) -> Optional[Fault]:
        """The first token feature that is empty or holds an id outside 0..vocab_size-1 (misfit checked dtypes)."""
        vocab = self.vocabulary(path)
        for name, feature in self.tokens.items():
            ids = token_ids(example, name, feature)
            if ids is None:
                continue  # absent, and its default [] allows it (else misfit named it)
            if name == WEIGHTED_TOKENS:
                ids = ids >> 1  # each 2 * id + weight (the weights are chat_fault's)
            if not ids.size:
                if feature.default is None:  # default: [] says empty sequences are meant
                    return Fault(path, record.index, record.offset, "empty_document",
                                 f"feature {name!r} holds no token id (an empty document)", FIXES["empty_document"])
                continue
            low, high = int(ids.min()), int(ids.max())
            if low < 0:
                return Fault(path, record.index, record.offset, "token_out_of_vocab",
                             f"token id {low} at position {int(ids.argmin())} of feature {name!r} < 0",
                             FIXES["token_out_of_vocab"])
            if vocab is not None and high >= vocab.size:
                return Fault(path, record.index, record.offset, "token_out_of_vocab",
                             f"token id {high} at position {int(ids.argmax())} of feature {name!r} >= vocab_size "
                             f"{vocab.size} ({vocab.origin})", vocab.fix())
        return None

    def record_fault(self, path: str, record: Record) -> Optional[Fault]:
        example = parse_record(record.data, self.features)  # an Example, or a SequenceExample when the spec says so
        found = misfit(example if example is not None else record.data, self.features)
        if found is not None:
            what = found.what if found.key is None or found.kind == "missing_feature" else f"feature {found.key!r} {found.what}"
            return Fault(path, record.index, record.offset, found.kind, what, found.fix)
        token = self.token_fault(path, record, example) if self.tokens else None
        if token is not None:
            return token
        chat = self.chats(path)
        if chat is not None or LOSS_WEIGHTS in self.features or WEIGHTED_TOKENS in self.features:
            found_chat = chat_fault(example, self.features, chat)
            if found_chat is not None:
                return Fault(path, record.index, record.offset, *found_chat)
        if self.label_key and self.num_classes:
            stored = context_features(example)
            values = stored[self.label_key].int64_list.value if self.label_key in stored else []
            if len(values) == 1 and not 0 <= values[0] < self.num_classes:
                return Fault(path, record.index, record.offset, "label_out_of_range",
                             f"label {self.label_key!r} is {values[0]}, outside 0..{self.num_classes - 1}",
                             FIXES["label_out_of_range"])
        if not self.ops:
            return None  # the checks above are all: no TensorFlow call per record
        features: Any = self.parse(tf.constant(record.data))
        for name, fn in self.ops:
            try:
                features = fn(features, None)
            except (tf.errors.OpError, ValueError, TypeError) as error:
                return Fault(path, record.index, record.offset, "op_failed", f"{name} fails: {tf_message(error)}",
                             FIXES["op_failed"])
        return None

    def check_file(self, path: str, compression: str, expected: Optional[int],
                   tick: Callable[[int], None] = lambda count: None, first_only: bool = False,
                   stop: Optional[threading.Event] = None) -> tuple[int, list[Fault]]:
        """(records framed, the file's faults); `first_only` stops at the first fault, `stop` when set."""
        faults: list[Fault] = []
        framed = 0
        for item in scan_records(path, compression):
            if stop is not None and stop.is_set():
                return framed, faults
            if isinstance(item, FramingFault):
                framed += 0 if item.rest_lost else 1
                what = item.what + ("; the rest of the file cannot be read" if item.rest_lost else "")
                hint = file_hint(path) if item.index == 0 else None  # text or Parquet given as TFRecords
                faults.append(Fault(path, item.index, item.offset, item.kind, what, hint or FIXES[item.kind]))
                if first_only:
                    return framed, faults
                continue
            framed += 1
            fault = self.record_fault(path, item)
            if fault is not None:
                faults.append(fault)
            tick(1)
            if first_only and faults:
                return framed, faults
        lost_tail = any(f.kind in TAIL_KINDS for f in faults)
        if expected is not None and framed != expected and not lost_tail:
            faults.append(Fault(path, None, None, "count_mismatch",
                                f"holds {framed} record(s), metadata.json lists {expected}", FIXES["count_mismatch"]))
        elif expected is None and framed == 0 and not faults:
            faults.append(Fault(path, None, None, "empty_file", "holds no record", FIXES["empty_file"]))
        return framed, faults
