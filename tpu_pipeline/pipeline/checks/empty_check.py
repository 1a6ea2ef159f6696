"""Empty data refused when a pipeline is built, in one line that names the source and the fix.

A source with no record makes every epoch empty, and a stream that repeats empty epochs never yields
(nor ends): `train` would wait at full CPU forever. `verify` reports such a file (`empty_file`); here
the same fact is established at build time within the cost the build already pays: the record counts
a converted dataset's metadata.json lists (no file is opened for them), else the first
record of the files in order (what the feature check reads anyway), so a source whose first file
holds a record costs one record read, as before. Checked per source of a mixture (a source of weight
0 is left out of it, so it may be empty).
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tpu_pipeline.errors import DataError
from tpu_pipeline.format import load_dataset_dir
from tpu_pipeline.pipeline.checks.spec_check import first_record
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource
from tpu_pipeline.pipeline.sources.base import RecordFileSource
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.sources.files import lists_no_file

# (a file that holds a record, its first record or None where counts said so without reading it), per source
Found = Optional[tuple[str, Optional[bytes]]]


def first_records(source: RecordFileSource, prefix: str = "data") -> list[Found]:
    """Per record source (a mixture: each of its own, in order), a file that holds a record and, where it
    was read, that record; a DataError naming the source, its files and the fix when one holds none."""
    if isinstance(source, MixtureSource):
        parts = [(f"{prefix}.mixture.sources[{index}] ({part.name})", f"{prefix}.mixture.sources.{index}.source",
                  part.source, part.weight) for index, part in enumerate(source.parts)]
    else:
        parts = [("", f"{prefix}.source", source, 1.0)]
    found: list[Found] = []
    for where, key, part, weight in parts:
        hit = _first(part)
        if hit is None and weight:
            raise DataError(_empty_line(where, key, part, in_mixture=bool(where)))
        found.append(hit)
    return found


def _first(part: RecordFileSource) -> Found:
    files_source = part.files_source()
    files = files_source.tfrecord_files()
    listed = files_source.listed_counts()
    if files and all(count is not None for count in listed):
        # metadata.json's counts, read as listed: a file that lost its records is named when the source is
        # read (`files.check_sizes`), in a line of its own
        return next(((path, None) for path, count in zip(files, listed) if count), None)
    for path in files:
        record = first_record(path, files_source.compression)
        if record is not None:
            return path, record
    return None


def _empty_line(where: str, key: str, part: RecordFileSource, in_mixture: bool) -> str:
    """The refusal: which source, what it holds (file, bytes, or the split's counts) and what to type."""
    drop = f", or remove this source from {key.rsplit('.', 2)[0]}" if in_mixture else ""
    if isinstance(part, DatasetDirSource) and part.replaced is None:
        metadata, _ = load_dataset_dir(part.dir, part.split)
        splits = metadata.get("splits") or {}
        held = {name: int(entry.get("num_examples") or 0) for name, entry in splits.items()}
        others = [name for name, count in held.items() if count > 0]
        choose = f"choose a split that holds records ({key}.split={others[0]})" if others else "choose a split that holds records"
        label = f"{where}: {key}.split" if where else f"{key}.split"
        if held.get(part.split):  # counts not listed per file, and the files hold nothing
            return (f"{label}={part.split}: the files of split {part.split!r} in {part.dir} hold no record, though its "
                    f"metadata.json lists {held[part.split]:,}; convert the data again{drop}")
        return (f"{label}={part.split}: {part.dir}'s metadata.json lists no record in split {part.split!r} (its splits: "
                + ", ".join(f"{name} {count:,}" for name, count in held.items())
                + f"), so there is nothing to read; {choose}, or convert the data again{drop}")
    files_source = part.files_source()
    files = files_source.tfrecord_files()
    patterns = files_source.files if isinstance(files_source.files, str) else ", ".join(files_source.files)
    label = f"{where}: {key}.files" if where else f"{key}.files"
    if not files:
        return lists_no_file(label, files_source.files, drop)
    size = int(tf.io.gfile.stat(files[0]).length)
    them = "the file it matches holds" if len(files) == 1 else f"all {len(files)} files it matches hold"
    return (f"{label}={patterns}: {them} no record ({files[0]}: {size:,} bytes), so there is nothing to read; "
            f"point {key}.files at TFRecord files that hold records, or write {'it' if len(files) == 1 else 'them'} "
            f"again{drop}")
