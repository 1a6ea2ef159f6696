"""`convert --from chat` (issue 50, items 1-3): conversations in three schemas and three file formats → `tokens` and
`loss_weights`, 1 on every assistant answer and its end-of-turn token, 0 elsewhere.

The central check is independent of the code under test: what the weighted tokens decode to must be exactly the
answers the records hold, each followed by its end-of-turn token, turn after turn. A mask one token off (the slip
the issue fears most: it trains the model to predict the user's turn) breaks it on every conversation.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from tpu_pipeline.config.data import WEIGHTED_TOKENS
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format import dataset_tokenizer
from tpu_pipeline.format.chat_encoding import ChatEncoder, chat_tokenizer
from tpu_pipeline.format.chat_template import CHATML, GEMMA, ChatTemplate, load_template
from tpu_pipeline.records import ConvertOptions, convert, read_metadata
from tpu_pipeline.records.chat_input import ChatSource, chat_source

from test_convert_text import cli

pytestmark = pytest.mark.tf_independent

SYSTEM = {"role": "system", "content": "You answer in one line."}


def conversations() -> list[list[dict]]:
    """Single and multi-turn, with and without a system message, non-ASCII, an answer with edge whitespace."""
    found = []
    for i in range(24):
        turns = [{"role": "user", "content": f"What is {i} times three?"},
                 {"role": "assistant", "content": f"It is {3 * i}."}]
        if i % 3 == 0:
            turns += [{"role": "user", "content": "And in words, café-style? ☕"},
                      {"role": "assistant", "content": f"Trois fois {i}: {3 * i} — voilà."}]
        if i % 4 == 1:
            turns += [{"role": "user", "content": "Thanks"}, {"role": "assistant", "content": " You're welcome "}]
        found.append(([SYSTEM] if i % 2 == 0 else []) + turns)
    return found


def expected_weighted_text(messages: list[dict], end_of_turn: str, trim: bool = False) -> str:
    """What the loss must be taken on, computed from the record alone: every answer, then the end of its turn."""
    return "".join((m["content"].strip() if trim else m["content"]) + end_of_turn
                   for m in messages if m["role"] == "assistant")


def write_jsonl(path, records: list[dict]) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return str(path)


def read_records(out) -> list[tuple[list[int], list[int]]]:
    """(tokens, loss_weights) of every record of every split, in file order."""
    metadata = read_metadata(str(out))
    rows = []
    for entry in metadata["splits"].values():
        for name in entry["files"]:
            for raw in tf.data.TFRecordDataset(os.path.join(str(out), name)):
                feature = tf.train.Example.FromString(raw.numpy()).features.feature
                if WEIGHTED_TOKENS in feature:  # each token 2 * id + weight
                    values = list(feature[WEIGHTED_TOKENS].int64_list.value)
                    rows.append(([v >> 1 for v in values], [v & 1 for v in values]))
                else:
                    rows.append((list(feature["tokens"].int64_list.value), []))
    return rows


def run_convert(source, out, **options) -> dict:
    convert(source, str(out), ConvertOptions(min_shards=1, progress=False, **options))
    return read_metadata(str(out))


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory) -> str:
    """A real Hugging Face tokenizer folder: a byte-level BPE trained here with `tokenizers` (ChatML's two special
    tokens added as ids 0 and 1), and a tokenizer_config.json whose chat_template is canonical ChatML, unmarked."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("hf_tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [m["content"] for c in conversations() for m in c] * 3
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>",
              "added_tokens_decoder": {"0": {"content": "<|im_start|>", "special": True},
                                       "1": {"content": "<|im_end|>", "special": True}}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


# --- templates ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, canonical", [("chatml", CHATML), ("gemma", GEMMA)])
def test_builtin_templates_render_the_canonical_text_and_find_the_same_answers_both_ways(name, canonical):
    """The built-ins mark answers with {% generation %} (one render); the canonical text, unmarked, is read turn by
    turn. Both must give the same text and the same spans, on every conversation."""
    marked = load_template(name)
    plain = ChatTemplate(canonical, name=f"{name} unmarked", bos_token=marked.bos_token)
    assert marked.marks_generation and not plain.marks_generation
    for messages in conversations():
        assert marked.render(messages) == plain.render(messages)


@pytest.fixture(scope="module")
def demo_conversations(tmp_path_factory) -> list[list[dict]]:
    """The chat demo's conversations (real docstrings, some two exchanges long) and ours."""
    from tpu_pipeline.records.demo_chat import write_instruction_set

    path = write_instruction_set(str(tmp_path_factory.mktemp("qa")), schemas=("messages",))["messages"][0]
    return [json.loads(line)["messages"] for line in open(path, encoding="utf-8")] + conversations()


@pytest.mark.parametrize("name", ["chatml", "gemma"])
def test_the_builtins_python_twins_render_what_their_jinja_renders(name, demo_conversations):
    template = load_template(name)
    assert template.direct is not None
    for messages in demo_conversations + [[{"role": "assistant", "content": "first"}]]:
        try:
            direct = template.render(messages)
        except DataError as error:
            direct = str(error)
        try:
            jinja = template.render_jinja(messages)
        except DataError as error:
            jinja = str(error)
        assert direct == jinja


@pytest.mark.parametrize("name", ["chatml", "gemma"])
def test_the_byte_level_batch_path_gives_what_token_offsets_give(name, demo_conversations):
    """The byte-level tokenizer's batched encoding (one buffer for many conversations) against the general path
    (each conversation's tokens and their offsets), conversation by conversation."""
    template = load_template(name)
    encoder = ChatEncoder(template, chat_tokenizer("bytes", template))
    rendered = [template.render(m) for m in demo_conversations]
    ids, weights, bounds = encoder.encode_many(rendered)
    assert len(bounds) == len(rendered) + 1
    for index, r in enumerate(rendered):
        one_ids, one_weights = encoder.encode_by_offsets(r)
        np.testing.assert_array_equal(ids[bounds[index]:bounds[index + 1]], one_ids)
        np.testing.assert_array_equal(weights[bounds[index]:bounds[index + 1]], one_weights)


def test_spans_are_the_answers_and_their_end_of_turn():
    template = load_template("chatml")
    for messages in conversations():
        rendered = template.render(messages)
        weighted = "".join(rendered.text[a:b] for a, b in rendered.spans)
        assert weighted == expected_weighted_text(messages, "<|im_end|>")


def test_a_prompt_to_sample_from_is_the_trained_text_up_to_the_answer():
    """What a user samples from after training (docs/text.md, Sampling a chat model): the conversation so far and
    the generation prompt, exactly the text the model saw before each answer it learned."""
    user = [{"role": "user", "content": "What is 12 plus 30?"}]
    chatml = "<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n<|im_start|>assistant\n"
    assert load_template("chatml").prompt(user) == chatml
    for name in ("chatml", "gemma"):
        template = load_template(name)
        for messages in conversations():
            for turn, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                rendered = template.render(messages[:turn + 1])
                answer_start = rendered.spans[-1][0]
                assert template.prompt(messages[:turn]) == rendered.text[:answer_start], (name, turn)


def test_a_template_whose_earlier_text_changes_is_refused_naming_the_turn():
    # The system line counts the turns: each added turn rewrites the start, so no answer can be located.
    template = ChatTemplate("{{ messages | length }}\n{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                            name="counting.jinja")
    with pytest.raises(DataError, match=r"conversation: chat template counting.jinja changes earlier text .* turn 2"):
        template.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])


def test_template_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="not a Jinja template"):
        ChatTemplate("{% for %}", name="bad.jinja")
    with pytest.raises(ConfigError, match=r"--chat_template nowhere.jinja: no such file; give chatml or gemma"):
        load_template("nowhere.jinja")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ConfigError, match="has no chat_template"):
        load_template(str(tmp_path))
    with pytest.raises(DataError, match="Conversation roles must alternate"):  # gemma's own check, as one line
        load_template("gemma").render([{"role": "assistant", "content": "hi"}], where="a.jsonl:3")


# --- tokenizers ----------------------------------------------------------------------------------------------------

def test_byte_level_adds_the_template_tokens_and_decodes_them():
    template = load_template("chatml")
    tokenizer = chat_tokenizer("bytes", template)
    encoder = ChatEncoder(template, tokenizer)
    assert encoder.special_ids == {"<|im_start|>": 259, "<|im_end|>": 260} and tokenizer.vocab_size == 261
    for messages in conversations():
        rendered = template.render(messages)
        ids, weights = encoder.encode(rendered)
        assert tokenizer.decode(ids.tolist()) == rendered.text
        assert tokenizer.decode(ids[weights == 1].tolist()) == expected_weighted_text(messages, "<|im_end|>")
        assert ids[weights == 1][-1] == 260 and weights[-1] == 0  # the answer ends on <|im_end|>, not on its "\n"


def test_a_hugging_face_tokenizer_and_its_unmarked_template(hf_files):
    template = load_template(hf_files)  # the folder's tokenizer_config.json
    assert not template.marks_generation and template.end_of_turn == "<|im_end|>"
    tokenizer = chat_tokenizer(f"hf:{hf_files}", template)
    encoder = ChatEncoder(template, tokenizer, f"hf:{hf_files}")
    assert encoder.special_ids == {"<|im_start|>": 0, "<|im_end|>": 1} and tokenizer.eos_id == 1
    for messages in conversations():
        ids, weights = encoder.encode(template.render(messages))
        kept = [int(i) for i in ids[weights == 1]]
        # decode with the special tokens written out: the answers and each <|im_end|>, nothing else
        assert tokenizer._tokenizer.decode(kept, skip_special_tokens=False) == expected_weighted_text(messages, "<|im_end|>")


def test_a_sentencepiece_model_without_the_template_tokens_is_refused_naming_both(tmp_path):
    from test_convert_text import train_spm

    model = train_spm(tmp_path, 300, "plain")
    with pytest.raises(ConfigError, match=r"chat template chatml writes the special token '<\|im_start\|>', which "
                                          rf"tokenizer spm:{model} spells out as \d+ ids instead of holding it as one"):
        ChatEncoder(load_template("chatml"), chat_tokenizer(f"spm:{model}", load_template("chatml")), f"spm:{model}")


def test_a_tokenizer_config_that_disagrees_with_its_tokenizer_is_refused(hf_files, tmp_path):
    config = json.loads(open(os.path.join(hf_files, "tokenizer_config.json")).read())
    config["added_tokens_decoder"]["5"] = config["added_tokens_decoder"].pop("1")  # <|im_end|> said to be id 5
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_template(str(tmp_path / "tokenizer_config.json"))
    with pytest.raises(ConfigError, match=r"gives '<\|im_end\|>' id 5, but tokenizer hf:.* gives it id 1"):
        ChatEncoder(template, chat_tokenizer(f"hf:{hf_files}", template), f"hf:{hf_files}")


# --- conversion ----------------------------------------------------------------------------------------------------

def as_schema(messages: list[dict], schema: str) -> dict:
    if schema == "messages":
        return {"messages": messages}
    prompt = [m for m in messages[:-1]]
    names = {"prompt_completion": ("prompt", "completion"), "question_answer": ("question", "answer")}[schema]
    if len(prompt) == 1:
        return {names[0]: prompt[0]["content"], names[1]: messages[-1]["content"]}
    return {names[0]: prompt, names[1]: [messages[-1]]}


def test_three_schemas_and_three_formats_give_the_same_records(tmp_path):
    import datasets

    chats = conversations()
    seen = {}
    for schema in ("messages", "prompt_completion", "question_answer"):
        path = write_jsonl(tmp_path / schema / "train.jsonl", [as_schema(m, schema) for m in chats])
        source = ChatSource([path], shuffle=False)
        assert source.schema == schema
        seen[schema] = read_records(tmp_path / f"out_{schema}") if run_convert(source, tmp_path / f"out_{schema}") else None
    table = pa.Table.from_pylist([{"messages": m} for m in chats])
    os.makedirs(tmp_path / "hub" / "data")
    pq.write_table(table, tmp_path / "hub" / "data" / "train-00000-of-00001.parquet", row_group_size=7)
    datasets.Dataset.from_list([{"messages": m} for m in chats]).save_to_disk(str(tmp_path / "saved"))
    for name in ("hub", "saved"):
        source = chat_source([str(tmp_path / name)], shuffle=False)
        run_convert(source, tmp_path / f"out_{name}")
        seen[name] = read_records(tmp_path / f"out_{name}")
    first = seen["messages"]
    assert len(first) == len(chats)
    for name, rows in seen.items():
        assert rows == first, name
    tokenizer = dataset_tokenizer(str(tmp_path / "out_hub"))
    for messages, (ids, weights) in zip(chats, first):
        kept = [i for i, w in zip(ids, weights) if w]
        assert tokenizer.decode(kept) == expected_weighted_text(messages, "<|im_end|>")


def test_metadata_counts_and_cli_summary(tmp_path, capsys):
    chats = conversations()
    path = write_jsonl(tmp_path / "in" / "chats.jsonl", [{"messages": m} for m in chats])
    code, out, err = cli(capsys, "--from", "chat", path, "--out", str(tmp_path / "out"), "--noprogress",
                         "--min_shards", "2", "--splits", "train=0.75,validation=0.25")
    assert code == 0, err
    metadata = read_metadata(str(tmp_path / "out"))
    rows = read_records(tmp_path / "out")
    total = sum(e["num_tokens"] for e in metadata["splits"].values())
    assert total == sum(len(ids) for ids, _ in rows)
    assert sum(e["num_weighted_tokens"] for e in metadata["splits"].values()) == sum(sum(w) for _, w in rows)
    assert sum(e["num_conversations"] for e in metadata["splits"].values()) == len(chats)
    assert metadata["chat"]["special_tokens"] == {"<|im_start|>": 259, "<|im_end|>": 260}
    assert metadata["chat"]["end_of_turn_id"] == 260 and metadata["chat"]["schema"] == "messages"
    assert metadata["features"] == {WEIGHTED_TOKENS: {"dtype": "int64", "kind": "ragged"}}
    assert metadata["chat"]["feature"] == WEIGHTED_TOKENS
    assert "train: 18 conversations" in out and "trained on)" in out
    assert "weighted_tokens: {dtype: int64, kind: ragged}" in out  # the config lines that read it


def test_loss_on_all_writes_no_weights_and_keeps_conversations_without_answers(tmp_path):
    unanswered = {"messages": [{"role": "user", "content": "Nobody answers this."}]}
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in conversations()[:4]] + [unanswered])
    metadata = run_convert(ChatSource([path], loss_on="all", shuffle=False), tmp_path / "out")
    assert list(metadata["features"]) == ["tokens"] and metadata["chat"]["loss_on"] == "all"
    rows = read_records(tmp_path / "out")
    assert len(rows) == 5 and all(weights == [] for _, weights in rows)
    assert metadata["splits"]["train"]["num_weighted_tokens"] == metadata["splits"]["train"]["num_tokens"]


def test_records_that_fit_no_schema_are_named_and_skipped_when_asked(tmp_path):
    good = {"messages": conversations()[0]}
    bad = [{"text": "plain"}, {"messages": [{"role": "user", "content": "no answer"}]},
           {"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]},
           {"messages": [{"role": "user", "content": {"x": 1}}, {"role": "assistant", "content": "y"}]}]
    path = write_jsonl(tmp_path / "mixed.jsonl", [good, *bad, good])
    with pytest.raises(DataError, match=rf"{path}:2: no field\(s\) \['messages'\] \(its fields: \['text'\]\)"):
        run_convert(ChatSource([path], shuffle=False), tmp_path / "out")
    metadata = run_convert(ChatSource([path], shuffle=False), tmp_path / "out2", on_error="skip")
    reasons = [s["reason"] for s in metadata["splits"]["train"]["skipped"]]
    assert len(reasons) == 4 and metadata["splits"]["train"]["num_conversations"] == 2
    assert "no assistant turn" in reasons[1] and "role 'wizard'" in reasons[2] and "content is a dict" in reasons[3]
    first = write_jsonl(tmp_path / "text.jsonl", [{"text": "plain"}])
    with pytest.raises(ConfigError, match=rf"{first}:1: no chat schema fits its fields \['text'\]"):
        ChatSource([first])


def test_an_overlong_conversation_loses_its_oldest_exchanges_whole_or_is_dropped(tmp_path):
    long = [SYSTEM] + [m for i in range(6) for m in ({"role": "user", "content": f"Question {i}?"},
                                                    {"role": "assistant", "content": f"Answer {i}."})]
    short = conversations()[2]  # one exchange
    assert [m["role"] for m in short] == ["system", "user", "assistant"]
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": long}, {"messages": short}])
    template, tokenizer = load_template("chatml"), chat_tokenizer("bytes", load_template("chatml"))
    length = lambda messages: len(tokenizer.encode(template.render(messages).text))  # noqa: E731
    limit = length([SYSTEM] + long[-4:])  # room for the system message and the last two exchanges exactly
    metadata = run_convert(ChatSource([path], shuffle=False, max_tokens=limit), tmp_path / "cut")
    entry = metadata["splits"]["train"]
    assert entry["num_truncated_conversations"] == 1 and entry["num_dropped_turns"] == 8
    (ids, weights), _ = read_records(tmp_path / "cut")
    kept = [SYSTEM] + long[-4:]
    assert tokenizer.decode(ids) == template.render(kept).text
    assert tokenizer.decode([i for i, w in zip(ids, weights) if w]) == expected_weighted_text(kept, "<|im_end|>")
    metadata = run_convert(ChatSource([path], shuffle=False, max_tokens=limit, overlong="drop"), tmp_path / "drop")
    entry = metadata["splits"]["train"]
    assert entry["num_dropped_long_conversations"] == 1 and entry["num_conversations"] == 1
    tiny = run_convert(ChatSource([path], shuffle=False, max_tokens=length(short) - 1), tmp_path / "tiny")
    assert tiny["splits"]["train"]["num_dropped_long_conversations"] == 1  # even its last exchange does not fit
    assert len(read_records(tmp_path / "tiny")) == 1


def test_chat_flags_are_checked_in_one_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": conversations()[0]}])
    code, _, err = cli(capsys, "--from", "text", path, "--text_field", "x", "--chat_template", "chatml", "--out",
                       str(tmp_path / "o"))
    assert code != 0 and "--chat_template: only with --from chat" in err
    code, _, err = cli(capsys, "--from", "chat", "--out", str(tmp_path / "o"))
    assert code != 0 and "--from chat needs at least one input" in err
    code, _, err = cli(capsys, "--from", "chat", path, "--tokenizer", "nope", "--out", str(tmp_path / "o"))
    assert code != 0 and "is not a tokenizer" in err


def test_byte_tokenizer_with_added_tokens_round_trips_through_metadata(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": conversations()[2]}])
    run_convert(ChatSource([path], template="gemma"), tmp_path / "out")
    tokenizer = dataset_tokenizer(str(tmp_path / "out"))
    (ids, _), = read_records(tmp_path / "out")
    assert tokenizer.vocab_size == 262 and tokenizer.decode(ids).startswith("<bos><start_of_turn>user\n")
    assert np.max(ids) < tokenizer.vocab_size


def test_text_converts_with_a_hugging_face_tokenizer_which_is_copied_beside_the_shards(hf_files, tmp_path):
    from tpu_pipeline.records import TextSource

    texts = ["It is 9. Trois fois 3: 9 — voilà.", "What is 4 times three?"]
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    metadata = run_convert(TextSource([path], tokenizer=f"hf:{hf_files}", text_field="text", shuffle=False),
                           tmp_path / "out")
    assert metadata["tokenizer"]["type"] == "huggingface" and metadata["tokenizer"]["special_ids"] == {"eos": 1}
    assert os.path.exists(tmp_path / "out" / "tokenizer.json")
    tokenizer = dataset_tokenizer(str(tmp_path / "out"))
    rows = read_records(tmp_path / "out")
    assert [tokenizer.decode(ids) for ids, _ in rows] == texts and all(ids[-1] == 1 for ids, _ in rows)


def test_a_line_that_is_no_json_object_is_named_among_good_lines(tmp_path):
    good = json.dumps({"messages": conversations()[0]})
    path = tmp_path / "lines.jsonl"
    path.write_text("\n".join([good, "{not json", "[1, 2]", "1, 2", "", good]) + "\n", encoding="utf-8")
    metadata = run_convert(ChatSource([str(path)], shuffle=False), tmp_path / "out", on_error="skip")
    entry = metadata["splits"]["train"]
    reasons = {s["where"].rsplit(":", 1)[1]: s["reason"] for s in entry["skipped"]}
    assert "not valid JSON" in reasons["2"] and "a JSON list" in reasons["3"] and "not valid JSON" in reasons["4"]
    assert entry["num_conversations"] == 2 and entry["num_empty"] == 1
