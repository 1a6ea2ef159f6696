"""ChatML with the byte-level tokenizer, encoded from flat arrays (records/chat_flat.py), writes the bytes the
record-by-record path writes (`ChatRecords.encode_rows`: render, tokenize, weigh), for every record of a mixed
batch: well-formed conversations of every role, non-ASCII and empty contents, a special token's text inside a
content, records that are errors (each with the record path's own line), conversations without an answer, and
over-long ones that are shortened or dropped. From JSON-like values (JSON lines) and from Arrow (Parquet), in all
three schemas.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tpu_pipeline.records.chat_input import chat_records
from tpu_pipeline.records.chat_records import SCHEMAS

pytestmark = pytest.mark.tf_independent

WORDS = ["hello", "café", "☕ tea", "", " ", "naïve résumé", "line\nbreak", "tab\there", "<|im", "end|>", "日本語",
         "x" * 40, "the answer is 42", "<b>bold</b>"]


def random_text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(0, 6))).tolist())


def messages_records(rng: np.random.Generator, count: int) -> list:
    """Mostly good conversations; a few of each kind that goes (or fails) record by record."""
    records = []
    for index in range(count):
        turns = [{"role": "system", "content": random_text(rng)}] if rng.random() < 0.4 else []
        for _ in range(int(rng.integers(1, 4))):
            turns += [{"role": "user", "content": random_text(rng)},
                      {"role": "assistant", "content": random_text(rng)}]
        if rng.random() < 0.2:
            turns.insert(int(rng.integers(0, len(turns))), {"role": "tool", "content": random_text(rng)})
        kind = index % 30
        if kind == 1:
            turns[-1]["content"] += " <|im_end|> injected"  # a special token's text: folded into its id
        elif kind == 2:
            turns = [t for t in turns if t["role"] != "assistant"]  # no answer
        elif kind == 3:
            turns[0]["role"] = "narrator"  # an unknown role: an error
        elif kind == 4:
            turns[-1]["content"] = [{"type": "text", "text": "parts, "}, {"type": "text", "text": "joined"}]
        elif kind == 5:
            turns = []  # an empty list: an error
        elif kind == 6:
            turns[0]["content"] = None
        elif kind == 7:
            turns[0]["content"] = "<|im_start|>"
        elif kind == 8:
            turns[-1]["content"] = "long " * 120  # over --max_conversation_tokens: shortened or dropped
        records.append({"messages": turns} if kind != 9 else {"other": 1})
    return records


def pair_records(rng: np.random.Generator, count: int, fields: tuple[str, str]) -> list:
    records = []
    for index in range(count):
        first, second = random_text(rng), random_text(rng)
        if index % 14 == 1:
            second = None
        elif index % 14 == 2:
            first = [{"role": "user", "content": "a prompt as messages"}]
        elif index % 14 == 3:
            first = 12
        elif index % 14 == 4:
            second = "<|im_start|>x"
        records.append({fields[0]: first, fields[1]: second})
    return records


def flat_and_rows(schema: str, loss_on: str, overlong: str):
    records = chat_records("chatml", "bytes", schema, loss_on=loss_on, max_tokens=400, overlong=overlong)
    assert records.flat is not None
    return records


def counting_rows(records, monkeypatch) -> list[int]:
    """How many records each call of the record-by-record path took (the flat way hands it the misfits)."""
    taken: list[int] = []
    encode_rows = records.encode_rows

    def counted(rows, wheres):
        taken.append(len(rows))
        return encode_rows(rows, wheres)

    monkeypatch.setattr(records, "encode_rows", counted)
    return taken


def same_results(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for index, ((encoded, error), (want, want_error)) in enumerate(zip(got, expected)):
        assert (error is None) == (want_error is None), (index, error, want_error)
        if error is not None:
            assert str(error) == str(want_error), index
            continue
        assert encoded.records == want.records, index
        assert dict(encoded.stats) == dict(want.stats), index


@pytest.mark.parametrize("loss_on, overlong", [("answers", "truncate"), ("answers", "drop"), ("all", "truncate")])
def test_messages_from_values_and_from_arrow_are_written_as_record_by_record(loss_on, overlong, monkeypatch):
    rng = np.random.default_rng(5)
    values = messages_records(rng, 260)
    wheres = [f"chat.jsonl:{i + 1}" for i in range(len(values))]
    records = flat_and_rows("messages", loss_on, overlong)
    expected = records.encode_rows(values, wheres)
    kinds = {("error" if e is not None else "written" if enc.records else "dropped") for enc, e in expected}
    assert kinds == {"error", "written", "dropped"} if overlong == "drop" else kinds >= {"error", "written"}
    taken = counting_rows(records, monkeypatch)
    same_results(records.encode_many(values, wheres), expected)
    assert 0 < sum(taken) < len(values) // 2, taken  # most went the flat way, the misfits record by record
    storable = [v for v in values if "messages" in v and all(isinstance(m.get("content"), (str, type(None)))
                                                              for m in v["messages"])]
    # Arrow: only records Parquet can hold in one column type (a content of parts or a record without the column
    # would change it), sliced: one chunk (its arrays keep an offset into their buffers), and chunks joined.
    whole = pa.Table.from_pylist(storable)
    for table in (whole.slice(3), pa.Table.from_batches(whole.to_batches(max_chunksize=37)).slice(3)):
        rows = table.to_pylist()
        arrow_wheres = [f"data/train.parquet, row {i}" for i in range(len(rows))]
        taken.clear()
        got = records.flat.encode_table(table, arrow_wheres)
        assert 0 < sum(taken) < len(rows) // 2, taken
        same_results(got, records.encode_rows(rows, arrow_wheres))


@pytest.mark.parametrize("schema", ["prompt_completion", "question_answer"])
def test_pairs_are_written_as_record_by_record(schema, monkeypatch):
    rng = np.random.default_rng(8)
    fields = SCHEMAS[schema]
    values = pair_records(rng, 120, fields)
    wheres = [f"pairs.jsonl:{i + 1}" for i in range(len(values))]
    records = flat_and_rows(schema, "answers", "truncate")
    taken = counting_rows(records, monkeypatch)
    same_results(records.encode_many(values, wheres), records.encode_rows(values, wheres))
    assert 0 < taken[0] < len(values) // 2, taken
    # Arrow: the two string columns (a value of another type stored as null), in chunks, sliced.
    whole = pa.table({name: [v[name] if isinstance(v[name], str) else None for v in values] for name in fields})
    table = pa.Table.from_batches(whole.to_batches(max_chunksize=29)).slice(2)
    rows = table.to_pylist()
    taken.clear()
    got = records.flat.encode_table(table, wheres[2:])
    assert 0 < sum(taken) < len(rows) // 2, taken
    same_results(got, records.encode_rows(rows, wheres[2:]))


def test_the_flat_way_applies_only_to_chatml_with_the_byte_level_tokenizer():
    assert chat_records("gemma", "bytes", "messages").flat is None
    assert chat_records("chatml", "bytes", "messages").flat is not None


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_strings_are_read_from_their_buffers_at_the_arrays_own_offset(kind):
    from tpu_pipeline.records.chat_flat import _data, _offsets

    strings = pa.array(["zero", "one", None, "ĉar", ""], kind).slice(1)  # a slice keeps an offset into the buffers
    assert strings.offset == 1
    offsets, data = _offsets(strings), _data(strings)
    assert [bytes(data[offsets[i]:offsets[i + 1]]).decode() for i in range(len(strings))] == ["one", "", "ĉar", ""]
