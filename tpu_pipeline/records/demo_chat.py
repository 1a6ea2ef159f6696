"""The built-in instruction demo: questions and answers about the Python standard library, from its docstrings.

A chat or instruction converter needs real question/answer text to be tested and shown on, text no one
here wrote and every Python installation holds. The docstrings of the standard library are that: for
each public function, class and method of a fixed list of pure-Python modules, "What does `json.dumps`
do?" is answered by the first paragraph of its docstring, and "What are the parameters of
`textwrap.wrap`?" by its signature: about 2,800 pairs, 300 KB of text, the same on every run of one
Python minor (the wording of each question is picked by a hash of the name, never by `random`; they are
read in a fresh interpreter, so no library this process imported can change them). About one record
in five of the "messages" schema holds two exchanges, so a converter that weights only the last
assistant turn shows it. `python -m tpu_pipeline.records.demo_chat --out DIR` writes them as JSON lines or Parquet
(the Hugging Face hub's layout) in three common schemas.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence

# Pure Python, quick to import, no side effects, and the same names on every platform.
MODULES = (
    "argparse", "base64", "bz2", "calendar", "codecs", "collections", "collections.abc", "configparser",
    "contextlib", "csv", "dataclasses", "datetime", "difflib", "doctest", "email.message", "email.utils", "enum",
    "fractions", "ftplib", "functools", "graphlib", "heapq", "html.parser", "http.client", "http.cookiejar",
    "http.cookies", "imaplib", "importlib.metadata", "inspect", "ipaddress", "json", "logging", "mailbox",
    "optparse", "pathlib", "pprint", "queue", "random", "re", "shlex", "smtplib", "statistics", "string",
    "tarfile", "textwrap", "threading", "traceback", "unittest", "urllib.parse", "xml.etree.ElementTree",
    "zipfile",
)
SYSTEM = "You answer questions about the Python standard library."
COLUMNS = {"messages": ("messages",), "question_answer": ("question", "answer"),
           "prompt_completion": ("prompt", "completion")}
SCHEMAS = tuple(COLUMNS)
FORMATS = ("jsonl", "parquet")
ANSWER_CHARS = 600  # an answer longer than this is cut at its last sentence end before it
MIN_ANSWER_CHARS = 20
CALL_LINE = re.compile(r"[\w.]+\(.*\)\s*(->.*)?$")  # a docstring paragraph that only shows a call: skipped
DESCRIBE = ("What does `{}` do?", "What is `{}` for?", "Explain `{}` briefly.",
            "Describe `{}` from the Python standard library.")
SIGNATURE = ("What are the parameters of `{}`?", "What is the signature of `{}`?",
             "How is `{}` called? Give its signature.")


def _template(templates: Sequence[str], name: str) -> str:
    return templates[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(templates)].format(name)


def _summary(doc: Optional[str]) -> Optional[str]:
    """The docstring's first paragraph on one line, cut at a sentence end under ANSWER_CHARS; None if unfit."""
    paragraphs = [" ".join(part.split()) for part in re.split(r"\n\s*\n", inspect.cleandoc(doc or ""))]
    paragraphs = [part for part in paragraphs if part and not CALL_LINE.match(part)] or [""]  # "f(x) -> y"
    text = paragraphs[0]
    if len(text) > ANSWER_CHARS:
        ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", text[:ANSWER_CHARS + 1])]
        text = text[:ends[-1]] if ends else ""
    return text if len(text) >= MIN_ANSWER_CHARS and not text.startswith(">>>") else None


def _signature(obj: Any) -> Optional[str]:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None
    return None if text == "(*args, **kwargs)" or re.search(r" at 0x[0-9a-fA-F]+", text) else text


def _members(module: str) -> list[tuple[str, Any]]:
    """(qualified name, object) of the module's public functions and classes and those classes' methods:
    those defined in it, and those its `__all__` exports from its own submodules (unittest.TestCase)."""
    found, imported = [], importlib.import_module(module)
    exported = set(getattr(imported, "__all__", ()))
    for name in sorted(set(vars(imported)) | exported):  # __all__ too: a package's lazy __getattr__ names
        obj = getattr(imported, name)
        if (name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)) or obj.__name__ != name
                or not (obj.__module__ == module or name in exported and obj.__module__.startswith(module + "."))):
            continue  # skips what it imports and its aliases
        found.append((f"{module}.{name}", obj))
        for method_name, method in vars(obj).items() if inspect.isclass(obj) else ():
            method = method.__func__ if isinstance(method, (staticmethod, classmethod)) else method
            if not method_name.startswith("_") and inspect.isfunction(method) and method.__name__ == method_name:
                found.append((f"{module}.{name}.{method_name}", method))
    return found


def _collect() -> list[tuple[str, str, str]]:
    """(module, question, answer), sorted by module, qualified name, then description before signature."""
    keyed = []
    for module in sorted(MODULES):
        for name, obj in _members(module):
            answer = _summary(obj.__doc__)  # its own docstring only: inspect.getdoc would inherit one
            if answer is None:
                continue
            keyed.append(((module, name, 0), _template(DESCRIBE, name), answer))
            signature = _signature(obj)
            if signature is not None:
                keyed.append(((module, name, 1), _template(SIGNATURE, name), name + signature))
    keyed.sort(key=lambda entry: entry[0])
    seen: set[str] = set()
    return [(key[0], q, a) for key, q, a in keyed if not (q in seen or seen.add(q))]


_CHILD = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('demo_chat', sys.argv[1]); "
          "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
          "print(json.dumps(module._collect()))")


@functools.lru_cache(maxsize=1)
def _entries() -> tuple[tuple[str, str, str], ...]:
    """_collect() run in a fresh interpreter holding only the standard library (-I -S): what this process has
    imported cannot change the pairs (importing Keras rewrites collections.abc.Mapping.get's docstring), nor -OO."""
    run = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, os.path.abspath(__file__)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"collecting the standard library's docstrings failed:\n{run.stderr[-2000:]}")
    return tuple((module, question, answer) for module, question, answer in json.loads(run.stdout))


def qa_pairs(limit: Optional[int] = None) -> list[tuple[str, str]]:
    """(question, answer) pairs from the standard library's docstrings, the same on every run; the first `limit`."""
    return [(question, answer) for _, question, answer in _entries()[:limit]]


def _records(schema: str, limit: Optional[int], system: bool) -> list[dict[str, Any]]:
    entries = _entries()[:limit]
    if schema == "question_answer":
        return [{"question": q, "answer": a} for _, q, a in entries]
    if schema == "prompt_completion":
        return [{"prompt": q, "completion": a} for _, q, a in entries]
    records, i = [], 0
    while i < len(entries):  # every fifth record two exchanges, when the next pair is of the same module
        take = 2 if len(records) % 5 == 4 and i + 1 < len(entries) and entries[i + 1][0] == entries[i][0] else 1
        messages = [{"role": "system", "content": SYSTEM}] if system else []
        for _, q, a in entries[i:i + take]:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        records.append({"messages": messages})
        i += take
    return records


def _write_atomically(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary path)` beside `path`, then renamed to it: an interrupted run leaves no `path`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                         dir=os.path.dirname(path))
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise


def _write_jsonl(records: list[dict[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def _write_parquet(records: list[dict[str, Any]], path: str, columns: Sequence[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([(key, pa.list_(message) if key == "messages" else pa.string()) for key in columns])
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path)


def _write_all(out_dir: str, schemas: Sequence[str], formats: Sequence[str], limit: Optional[int],
               system: bool) -> dict[str, list[tuple[str, int]]]:
    for value, known in [(s, SCHEMAS) for s in schemas] + [(f, FORMATS) for f in formats]:
        if value not in known:
            raise ValueError(f"unknown {'schema' if known is SCHEMAS else 'format'} {value!r}: use one of {known}")
    written: dict[str, list[tuple[str, int]]] = {}
    for schema in schemas:
        records = _records(schema, limit, system)
        for fmt in formats:
            path = (os.path.join(out_dir, schema, "train.jsonl") if fmt == "jsonl" else
                    os.path.join(out_dir, f"{schema}_parquet", "data", "train-00000-of-00001.parquet"))
            if fmt == "jsonl":
                _write_atomically(path, lambda temporary: _write_jsonl(records, temporary))
            else:
                _write_atomically(path, lambda temporary: _write_parquet(records, temporary, COLUMNS[schema]))
            written.setdefault(schema, []).append((path, len(records)))
    return written


def write_instruction_set(out_dir: str, *, schemas: Sequence[str] = SCHEMAS, formats: Sequence[str] = ("jsonl",),
                          limit: Optional[int] = None, system: bool = True) -> dict[str, list[str]]:
    """Writes the pairs in each schema and format under `out_dir`; returns the paths written, per schema.

    jsonl: `<out_dir>/<schema>/train.jsonl`; parquet: `<out_dir>/<schema>_parquet/data/train-00000-of-00001.parquet`.
    `limit` keeps the first pairs; `system=False` leaves the system message out of the "messages" schema."""
    written = _write_all(out_dir, schemas, formats, limit, system)
    return {schema: [path for path, _ in files] for schema, files in written.items()}


CHAT_DEMO_DIR = os.path.join("demo_chat", "v2")  # under the cache (v2: weighted_tokens); configs/chat_sft.yaml names it
CHAT_DEMO_TOKENS = 512  # --max_conversation_tokens of the demo: its data.sequence.length


def ensure_chat_demo(cache_dir: Optional[str] = None, out_dir: Optional[str] = None, limit: Optional[int] = None) -> str:
    """The chat demo, converted once by the real chat converter (ChatML, byte-level, a tenth in validation) into
    `out_dir`; returns it. `limit`: only the first pairs (tests). Imports stay inside: this file also runs in a
    bare interpreter (_CHILD)."""
    from tpu_pipeline.format import read_metadata
    from tpu_pipeline.records.chat_input import ChatSource
    from tpu_pipeline.records.convert import ConvertOptions, convert
    from tpu_pipeline.system import default_cache_dir

    out_dir = out_dir or os.path.join(cache_dir or default_cache_dir(), CHAT_DEMO_DIR)
    if read_metadata(out_dir) is not None:
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stdlib_qa-") as scratch:
        path = write_instruction_set(scratch, schemas=("messages",), limit=limit)["messages"][0]
        source = ChatSource([path], template="chatml", tokenizer="bytes", max_tokens=CHAT_DEMO_TOKENS,
                            splits="train=0.9,validation=0.1", seed=0)
        convert(source, out_dir, ConvertOptions(min_shards=2 if limit else 4, progress=False))
    return out_dir


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Writes question/answer pairs from the standard library's "
                                                 "docstrings as an instruction data set.")
    parser.add_argument("--out", required=True, help="directory to write into")
    parser.add_argument("--schemas", default=",".join(SCHEMAS), help=f"comma-separated, of {', '.join(SCHEMAS)}")
    parser.add_argument("--formats", default="jsonl", help=f"comma-separated, of {', '.join(FORMATS)}")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first LIMIT pairs")
    parser.add_argument("--no-system", action="store_true", help="no system message in the messages schema")
    args = parser.parse_args(argv)
    try:
        written = _write_all(args.out, args.schemas.split(","), args.formats.split(","), args.limit,
                             not args.no_system)
    except ValueError as error:
        parser.error(str(error))
    for files in written.values():
        for path, count in files:
            print(f"{path}: {count} records")


if __name__ == "__main__":
    main()
