"""Chat conversion against text conversion, per token, on the same conversations (issue 50, item 7).

    .venv/bin/python benchmarks/bench_chat_convert.py --copies 8 --rounds 3

The chat demo's conversations (records/demo_chat.py: the standard library's docstrings as questions and
answers, `messages` with a system turn), `--copies` times over, written as

  chat jsonl      JSON lines of `messages`, converted by `convert --from chat` (ChatML, byte-level: render the
                  template, tokenize the whole text, weight the answers, write tokens + loss_weights)
  text jsonl      the same conversations already rendered, one `text` field a line, converted by
                  `convert --from text --text_field text` (byte-level): the text path on the same bytes
  chat parquet,   the same two as hub-layout Parquet (`--from chat`, `--from parquet --text_field text`)
  text parquet

Each round converts each input once into a fresh directory, in a rotated order, with the converter's
default workers; printed: tokens per second of each (tokens from metadata.json, wall time of `convert()`,
TensorFlow already imported) and chat ÷ text within each round, as median (worst) over the rounds. The issue
asks chat to convert at least as fast per token as text does. Absolute rates drift on a shared 2-core machine:
read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tpu_pipeline.format.chat_template import load_template  # noqa: E402
from tpu_pipeline.records import ConvertOptions, convert, read_metadata  # noqa: E402
from tpu_pipeline.records.chat_input import chat_source  # noqa: E402
from tpu_pipeline.records.demo_chat import write_instruction_set  # noqa: E402
from tpu_pipeline.records.table_input import TableSource  # noqa: E402
from tpu_pipeline.records.text_input import TextSource  # noqa: E402


def inputs(root: str, copies: int) -> dict[str, str]:
    """The four inputs, each holding the same conversations `copies` times."""
    path = write_instruction_set(os.path.join(root, "qa"), schemas=("messages",))["messages"][0]
    conversations = [json.loads(line)["messages"] for line in open(path, encoding="utf-8")] * copies
    template = load_template("chatml")
    texts = [template.render(messages).text for messages in conversations]
    found = {"chat jsonl": os.path.join(root, "chat.jsonl"), "text jsonl": os.path.join(root, "text.jsonl")}
    with open(found["chat jsonl"], "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in conversations)
    with open(found["text jsonl"], "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    for name, table in (("chat parquet", pa.Table.from_pylist([{"messages": m} for m in conversations])),
                        ("text parquet", pa.table({"text": texts}))):
        folder = os.path.join(root, name.replace(" ", "_"), "data")
        os.makedirs(folder)
        pq.write_table(table, os.path.join(folder, "train-00000-of-00001.parquet"), row_group_size=1024)
        found[name] = os.path.dirname(folder)
    return found


def source(name: str, path: str):
    if name == "chat jsonl" or name == "chat parquet":
        return chat_source([path], template="chatml", tokenizer="bytes")
    if name == "text jsonl":
        return TextSource([path], text_field="text")
    return TableSource(path, kind="parquet", text_field="text")


def timed(name: str, path: str, out: str) -> float:
    """Tokens per second of one conversion (the source's set-up, such as counting lines, included)."""
    start = time.perf_counter()
    convert(source(name, path), out, ConvertOptions(min_shards=2, progress=False))
    seconds = time.perf_counter() - start
    tokens = sum(entry["num_tokens"] for entry in read_metadata(out)["splits"].values())
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=8, help="the demo's conversations this many times over")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_chat_convert-") as root:
        paths = inputs(root, args.copies)
        names = list(paths)
        rounds = []
        for index in range(args.rounds):
            order = names[index % len(names):] + names[:index % len(names)]
            rates = {name: timed(name, paths[name], os.path.join(root, f"out{index}-{name.replace(' ', '_')}"))
                     for name in order}
            rounds.append(rates)
            print(f"round {index + 1}: " + ", ".join(f"{n} {rates[n] / 1e6:.2f}" for n in names)
                  + f" M tokens/s (load average {os.getloadavg()[0]:.1f})", flush=True)
        for kind in ("jsonl", "parquet"):
            ratios = [r[f"chat {kind}"] / r[f"text {kind}"] for r in rounds]
            print(f"chat ÷ text, {kind}: tokens/s {statistics.median(ratios):.2f} (worst {min(ratios):.2f}); chat "
                  f"{statistics.median(r[f'chat {kind}'] for r in rounds) / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    main()
