"""The built-in text demo: the CPython documentation that ships with every Python, byte-level tokens.

`pydoc_data.topics` (what `help('topics')` prints) is real English prose with code in it, about
450 KB on Python 3.11, so a small language model learns it visibly on a CPU in minutes. Each
paragraph is a document. It goes through the real text converter (`convert --from text`), from a
JSON-lines file, into the cache once; later runs reuse it.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from typing import Callable, Iterable

from absl import logging

from tpu_pipeline.format import read_metadata
from tpu_pipeline.records.convert import ConvertOptions, convert
from tpu_pipeline.records.text_input import TextSource
from tpu_pipeline.system import default_cache_dir

TEXT_DEMO_DIR = os.path.join("demo_text", "v1")  # under the cache; configs/text_lm.yaml names it
CODE_DEMO_DIR = os.path.join("demo_code", "v2")  # ... and configs/text_lm_mixture.yaml this one too
CODE_DEMO_BYTES = 1 << 20  # the standard library's first modules (by name) up to ~1 MB of source


def paragraphs() -> list[str]:
    """Every topic of pydoc_data.topics, split at blank lines, in topic-name order (empty ones dropped)."""
    from pydoc_data.topics import topics

    found = []
    for name in sorted(topics):
        found += [part.strip("\n") for part in re.split(r"\n[ \t]*\n", topics[name]) if part.strip()]
    return found


def ensure_text_demo(cache_dir: str | None = None, out_dir: str | None = None) -> str:
    """Converts the demo text once (train 95%, validation 5% of the paragraphs); returns its directory."""
    out_dir = out_dir or os.path.join(cache_dir or default_cache_dir(), TEXT_DEMO_DIR)
    return _convert_once(out_dir, "pydoc_topics", paragraphs, "train=0.95,validation=0.05")


def _convert_once(out_dir: str, stem: str, documents: Callable[[], Iterable[str]], splits: str) -> str:
    """`documents()` through the real text converter (byte-level) into `out_dir`, unless it is there already."""
    if read_metadata(out_dir) is not None:
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{stem}-") as scratch:
        path = os.path.join(scratch, f"{stem}_py{sys.version_info.major}.{sys.version_info.minor}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for document in documents():
                handle.write(json.dumps({"text": document}) + "\n")
        source = TextSource([path], splits=splits, seed=0, tokenizer="bytes", text_field="text")
        convert(source, out_dir, ConvertOptions(min_shards=4, progress=False))
    logging.info("wrote the built-in demo text (%s) to %s; later runs reuse it (TPU_PIPELINE_CACHE moves it)",
                 stem, out_dir)
    return out_dir


def code_files() -> list[str]:
    """The Python standard library's top-level modules, by name, up to CODE_DEMO_BYTES of source."""
    import sysconfig

    library = sysconfig.get_paths()["stdlib"]
    chosen, total = [], 0
    for name in sorted(os.listdir(library)):
        path = os.path.join(library, name)
        if name.endswith(".py") and os.path.isfile(path):
            chosen.append(path)
            total += os.path.getsize(path)
            if total >= CODE_DEMO_BYTES:
                break
    return chosen


def ensure_code_demo(cache_dir: str | None = None, out_dir: str | None = None) -> str:
    """Converts the code demo once (each standard-library module a document; a tenth of them in split validation):
    a second corpus beside the text demo, for the mixture example. Returns its directory."""
    out_dir = out_dir or os.path.join(cache_dir or default_cache_dir(), CODE_DEMO_DIR)

    def modules() -> Iterable[str]:
        for module in code_files():
            with open(module, encoding="utf-8", errors="replace") as source:
                yield source.read()

    return _convert_once(out_dir, "stdlib", modules, "train=0.9,validation=0.1")
