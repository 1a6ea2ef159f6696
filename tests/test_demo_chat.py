"""The instruction demo (tpu_pipeline/records/demo_chat.py): question/answer pairs from the standard library's
docstrings, written in three schemas as JSON lines and as Parquet in the Hugging Face hub's layout."""
from __future__ import annotations

import importlib
import json
import os
import textwrap

import pytest

pytestmark = pytest.mark.tf_independent

from tpu_pipeline.records import demo_chat  # noqa: E402
from tpu_pipeline.records.demo_chat import qa_pairs, write_instruction_set  # noqa: E402

KEYS = {"messages": {"messages"}, "question_answer": {"question", "answer"},
        "prompt_completion": {"prompt", "completion"}}


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, _, names in os.walk(root) for name in names)


def test_the_pairs_are_the_same_every_time_nonempty_and_every_question_once():
    pairs = qa_pairs()
    assert pairs == qa_pairs()
    assert 2000 <= len(pairs) <= 6000
    assert all(question.strip() and answer.strip() for question, answer in pairs)
    assert len({question for question, _ in pairs}) == len(pairs)
    described = [answer for question, answer in pairs if "signature" not in question and "parameters" not in question]
    assert described and all(len(answer) <= demo_chat.ANSWER_CHARS for answer in described)
    assert "textwrap.wrap(text, width=70, **kwargs)" in {answer for _, answer in pairs}


def test_nothing_this_process_did_to_the_standard_library_changes_the_pairs(monkeypatch):
    pairs = qa_pairs()
    monkeypatch.setattr(textwrap.wrap, "__doc__", "Rewritten by a library this process imported, as Keras does.")
    demo_chat._entries.cache_clear()
    try:
        assert qa_pairs() == pairs
    finally:
        demo_chat._entries.cache_clear()


def test_every_module_imports_and_gives_pairs():
    named = " ".join(question for question, _ in qa_pairs())
    for module in demo_chat.MODULES:
        importlib.import_module(module)
        assert f"`{module}." in named, module


def test_limit_keeps_the_first_pairs(tmp_path):
    assert qa_pairs(limit=7) == qa_pairs()[:7]
    written = write_instruction_set(str(tmp_path), schemas=("question_answer",), limit=10)
    assert written == {"question_answer": [str(tmp_path / "question_answer" / "train.jsonl")]}
    assert len(read_jsonl(written["question_answer"][0])) == 10


def test_each_schema_holds_every_pair_and_a_fifth_of_the_chats_have_two_exchanges(tmp_path):
    pairs = qa_pairs()
    written = write_instruction_set(str(tmp_path))
    assert files_under(tmp_path) == [os.path.join(schema, "train.jsonl") for schema in sorted(KEYS)]
    records = {schema: read_jsonl(paths[0]) for schema, paths in written.items()}
    for schema, keys in KEYS.items():
        assert all(set(record) == keys for record in records[schema]), schema
    assert [(r["question"], r["answer"]) for r in records["question_answer"]] == pairs
    assert [(r["prompt"], r["completion"]) for r in records["prompt_completion"]] == pairs

    chats = [record["messages"] for record in records["messages"]]
    assert all(chat[0] == {"role": "system", "content": demo_chat.SYSTEM} for chat in chats)
    exchanges = [(chat[i]["content"], chat[i + 1]["content"]) for chat in chats for i in range(1, len(chat), 2)]
    assert all([m["role"] for m in chat[1:]] == ["user", "assistant"] * ((len(chat) - 1) // 2) for chat in chats)
    assert exchanges == pairs  # every pair once, in order, whether alone or in a two-exchange chat
    two = sum(len(chat) == 5 for chat in chats)
    assert {len(chat) for chat in chats} == {3, 5} and 0.15 <= two / len(chats) <= 0.21


def test_without_a_system_message(tmp_path):
    written = write_instruction_set(str(tmp_path), schemas=("messages",), limit=30, system=False)
    chats = [record["messages"] for record in read_jsonl(written["messages"][0])]
    assert chats and all(chat[0]["role"] == "user" for chat in chats)
    assert any(len(chat) == 4 for chat in chats)


def test_parquet_in_the_hub_layout_reads_back_as_the_json_lines(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    written = write_instruction_set(str(tmp_path), formats=("jsonl", "parquet"), limit=40)
    for schema, (jsonl, parquet) in written.items():
        assert parquet == str(tmp_path / f"{schema}_parquet" / "data" / "train-00000-of-00001.parquet")
        table = pq.read_table(parquet)
        assert table.to_pylist() == read_jsonl(jsonl), schema
    messages = pq.read_schema(written["messages"][1]).field("messages").type
    assert messages == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert not [name for name in files_under(tmp_path) if "tmp" in name]
    empty = write_instruction_set(str(tmp_path / "empty"), schemas=("question_answer",), formats=("parquet",), limit=0)
    assert pq.read_table(empty["question_answer"][0]).column_names == ["question", "answer"]


def test_an_interrupted_write_leaves_nothing(tmp_path):
    path = str(tmp_path / "messages" / "train.jsonl")

    def interrupted(temporary: str) -> None:
        with open(temporary, "w") as out:
            out.write("{}\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        demo_chat._write_atomically(path, interrupted)
    assert files_under(tmp_path) == []


def test_unknown_schema_or_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="schema 'chatml'"):
        write_instruction_set(str(tmp_path), schemas=("chatml",))
    with pytest.raises(ValueError, match="format 'csv'"):
        write_instruction_set(str(tmp_path), formats=("csv",))


def test_the_command_prints_each_file_and_its_records(tmp_path, capsys):
    demo_chat.main(["--out", str(tmp_path), "--schemas", "messages,question_answer", "--formats", "jsonl,parquet",
                    "--limit", "12"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert lines[2] == f"{tmp_path / 'question_answer' / 'train.jsonl'}: 12 records"
    assert lines[0].startswith(f"{tmp_path / 'messages' / 'train.jsonl'}: ")
