"""`verify` on chat data (issue 50, item 5): each record's loss mask checked against its tokens.

Real TFRecord shards of rendered ChatML conversations (`tokens`, and `loss_weights`: 1 on each assistant
answer and its `<|im_end|>`, 0 elsewhere) in a directory with a metadata.json `chat` entry, as `convert
--from chat` writes it. The first shard is good; the second plants one fault of each check at a known
record, good records between them: weights missing, one short, a weight of 2, a conversation without an
answer, `<|im_end|>` split into pieces by the tokenizer, and the mask one token off (left and right),
the bug the end-of-turn check is for.
"""
from __future__ import annotations

import os

import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS
from tpu_pipeline.format.metadata import shard_name, write_metadata
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.verify import verify_data

from test_verify_tokens import data_config, offsets

pytestmark = pytest.mark.tf_builds

VOCAB, START, END, NEWLINE = 261, 259, 260, 10  # <|im_start|>, <|im_end|>, "\n"
ROLES = {"system": 20, "user": 21, "assistant": 22}
FEATURES = {"tokens": {"dtype": "int64", "kind": "ragged"}, LOSS_WEIGHTS: {"dtype": "int64", "kind": "ragged"}}
CHAT = {"template": "chatml", "schema": "messages", "loss_on": "answers",
        "special_tokens": {"<|im_start|>": START, "<|im_end|>": END}, "end_of_turn": "<|im_end|>",
        "end_of_turn_id": END}
PER_SHARD = 12
# record of the bad shard → (what is planted, the kind verify names)
PLANTS = {1: ("no_weights", "missing_feature"), 3: ("one_short", "loss_weights"), 5: ("weight_2", "loss_weights"),
          7: ("no_answer", "no_weighted_token"), 9: ("split_end", "no_end_of_turn"),
          10: ("shift_left", "misaligned_weights"), 11: ("shift_right", "misaligned_weights")}


def render(turns: list[tuple[str, list[int]]]) -> tuple[list[int], list[int]]:
    """ChatML, `<|im_start|>role\\ncontent<|im_end|>\\n` per turn; weight 1 on each answer's content and
    its <|im_end|>."""
    tokens, weights = [], []
    for role, content in turns:
        answer = int(role == "assistant")
        head, body, tail = [START, ROLES[role], NEWLINE], content + [END], [NEWLINE]
        tokens += head + body + tail
        weights += [0] * len(head) + [answer] * len(body) + [0] * len(tail)
    return tokens, weights


def conversation(index: int) -> list[tuple[str, list[int]]]:
    """A system prompt, then one or two question/answer pairs: their ids say the record (30 + index...)."""
    turns = [("system", [40, 41]), ("user", [50 + index, 51]), ("assistant", [30 + index, 31, 32])]
    if index % 2:
        turns += [("user", [52]), ("assistant", [33, 34 + index])]
    return turns


def example(tokens: list[int], weights: list[int] | None) -> bytes:
    feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
    if weights is not None:
        feature[LOSS_WEIGHTS] = tf.train.Feature(int64_list=tf.train.Int64List(value=weights))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def planted(index: int, plant: str) -> bytes:
    tokens, weights = render(conversation(index))
    if plant == "no_weights":
        return example(tokens, None)
    if plant == "one_short":
        return example(tokens, weights[:-1])
    if plant == "weight_2":
        return example(tokens, weights[:18] + [2] + weights[19:])  # position 18: the answer's 2nd token
    if plant == "no_answer":
        return example(*render([turn for turn in conversation(index) if turn[0] != "assistant"]))
    if plant == "split_end":  # a tokenizer that does not know <|im_end|> spells it in bytes
        split = [piece for token in tokens for piece in ([60, 124, 105] if token == END else [token])]
        return example(split, [w for token, w in zip(tokens, weights) for w in ([w] * 3 if token == END else [w])])
    if plant == "shift_left":
        return example(tokens, weights[1:] + [0])
    return example(tokens, [0] + weights[:-1])  # shift_right


def write_chat_dataset(directory: str, plants: dict = PLANTS, chat: dict = CHAT, features: dict = FEATURES
                       ) -> list[str]:
    """Two shards and the metadata.json of a converted chat dataset; record `index` of the second shard is
    conversation `PER_SHARD + index`, planted where `plants` says."""
    os.makedirs(directory)
    names = [shard_name("train", i, 2) for i in range(2)]
    for shard, name in enumerate(names):
        with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
            for record in range(PER_SHARD):
                index = shard * PER_SHARD + record
                if shard == 1 and record in plants:
                    writer.write(planted(index, plants[record][0]))
                elif chat.get("loss_on") == "all":
                    writer.write(example(render(conversation(index))[0], None))
                else:
                    writer.write(example(*render(conversation(index))))
    write_metadata(directory, {
        "format_version": 1, "name": "planted_chat", "source": {"type": "chat"}, "features": features,
        "class_names": None, "compression": "", "chat": chat,
        "tokenizer": {"type": "bytes", "vocab_size": VOCAB, "offset": 3, "special_ids": {"pad": 0, "bos": 1, "eos": 2}},
        "splits": {"train": {"files": names, "counts": [PER_SHARD] * 2, "num_examples": 2 * PER_SHARD,
                             "num_skipped": 0, "skipped": []}}})
    return [os.path.join(directory, name) for name in names]


def verify(directory: str, **data):
    return verify_data(config_from_dict({"data": data_config(directory, **data)}).data, progress=False)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_CACHE", str(tmp_path / "cache"))


def test_a_good_chat_dataset_verifies_clean(tmp_path):
    paths = write_chat_dataset(str(tmp_path / "chat"), plants={})
    report = verify(os.path.dirname(paths[0]))
    assert report.faults == [] and report.records == 2 * PER_SHARD, report.table()
    # weights are no token ids: only 'tokens' meets the vocabulary
    assert report.notes == [f"token ids of 'tokens' checked against vocab_size {VOCAB} (metadata.json tokenizer)",
                            "a chatml chat set (metadata.json chat): 'loss_weights' checked, 0 or 1, one per token, at "
                            "least one weighted token per conversation, each run of them ending on its end of turn "
                            "<|im_end|> (id 260)"]  # "no fault found" says the masks were read too


def test_verify_names_each_chat_fault_by_file_record_and_byte(tmp_path):
    paths = write_chat_dataset(str(tmp_path / "chat"))
    report = verify(os.path.dirname(paths[0]))
    bad, starts = paths[1], offsets(paths[1])
    assert [(f.file, f.record, f.offset, f.kind) for f in report.faults] == [
        (bad, record, starts[record], kind) for record, (_, kind) in sorted(PLANTS.items())], report.table()
    what = {f.record: f.what for f in report.faults}
    assert what[1].startswith("has no feature 'loss_weights'")  # the spec (metadata.json features) names it first
    tokens = len(render(conversation(PER_SHARD + 3))[0])
    assert what[3] == f"feature 'loss_weights' holds {tokens - 1} weight(s) for the {tokens} token(s) of 'tokens'; " \
                      "one weight per token"
    assert what[5] == "weight 2 at position 18 of feature 'loss_weights' is not 0 or 1"
    assert what[7] == "no weighted token: a conversation without an assistant answer"
    assert what[9] == "holds no end of turn <|im_end|> (id 260) of template 'chatml'"
    # the first answer is tokens 17..19 and its <|im_end|> 20 (after <|im_start|> 14, 'assistant' 15, "\n" 16).
    # Shifted left, its run starts on that "\n" and ends on its last word (32); right, it ends on the "\n" after
    # <|im_end|>. Record 10 is conversation 22 (one answer), record 11 conversation 23 (two)
    assert what[10] == "the weighted run at positions 16..19 ends on token 32, not the end of turn <|im_end|> " \
                       "(id 260); 1 of the record's 1 weighted run(s) miss it"
    assert what[11] == f"the weighted run at positions 18..21 ends on token {NEWLINE}, not the end of turn " \
                       "<|im_end|> (id 260); 2 of the record's 2 weighted run(s) miss it"
    fix = {f.record: f.fix for f in report.faults}
    assert fix[7] == "drop it, or convert with --loss_on all"
    assert "a mask one token off trains on the prompt" in fix[10] and "special tokens" in fix[9]
    lines = [f.line() for f in report.faults]
    assert lines[3] == (f"{bad}, record 7 (byte {starts[7]:,}): no weighted token: a conversation without an "
                        "assistant answer; drop it, or convert with --loss_on all")
    assert f"{bad} | 10 | {starts[10]:,} | the weighted run at positions 16..19" in report.table()


def test_missing_weights_are_named_where_the_config_does_not_declare_them(tmp_path):
    """A config listing its own features without loss_weights: the chat entry still says every record holds them."""
    paths = write_chat_dataset(str(tmp_path / "chat"), plants={1: PLANTS[1], 5: PLANTS[5]})
    report = verify(os.path.dirname(paths[0]), features={"tokens": FEATURES["tokens"]})
    assert [(f.record, f.kind) for f in report.faults] == [(1, "loss_weights"), (5, "loss_weights")], report.table()
    assert report.faults[0].what == "has no feature 'loss_weights', which metadata.json chat.loss_on 'answers' says " \
                                    "every record holds (one weight per token)"


def test_an_unknown_end_of_turn_leaves_the_alignment_unchecked(tmp_path):
    chat = {**CHAT, "template": "custom", "end_of_turn": None, "end_of_turn_id": None}
    paths = write_chat_dataset(str(tmp_path / "chat"), chat=chat)
    report = verify(os.path.dirname(paths[0]))
    assert {(f.record, f.kind) for f in report.faults} == {
        (1, "missing_feature"), (3, "loss_weights"), (5, "loss_weights"), (7, "no_weighted_token")}, report.table()
    assert report.notes[1] == ("a custom chat set (metadata.json chat): 'loss_weights' checked, 0 or 1, one per token, "
                               "at least one weighted token per conversation")


def test_loss_on_all_needs_no_weights_but_the_end_of_turn(tmp_path):
    paths = write_chat_dataset(str(tmp_path / "chat"), plants={7: PLANTS[7], 9: PLANTS[9]},
                               chat={**CHAT, "loss_on": "all"}, features={"tokens": FEATURES["tokens"]})
    report = verify(os.path.dirname(paths[0]))
    # record 7 (no answer) has its weights, all 0: nothing wrong with loss_on all; record 9 lacks <|im_end|>
    assert [(f.record, f.kind) for f in report.faults] == [(9, "no_end_of_turn")], report.table()
    assert report.notes[1] == ("a chatml chat set trained on every token (loss_on all): each conversation's end of "
                               "turn <|im_end|> (id 260) checked")


def test_weights_of_any_config_are_0_or_1(tmp_path):
    """A glob of files with no metadata.json, whose config reads loss_weights: only their values are checked."""
    path = str(tmp_path / "weighted.tfrecord")
    tokens, weights = render(conversation(0))
    with tf.io.TFRecordWriter(path) as writer:
        for planted_weights in [weights, [0] * len(tokens), [0] + weights[:-1], weights[:3] + [-1] + weights[4:]]:
            writer.write(example(tokens, planted_weights))
    data = {"source": {"type": "tfrecord", "files": path}, "features": FEATURES, "batch_size": 1, "outputs": None}
    (fault,) = verify_data(config_from_dict({"data": data}).data, progress=False).faults
    assert (fault.record, fault.kind, fault.what) == (
        3, "loss_weights", "weight -1 at position 3 of feature 'loss_weights' is not 0 or 1"), fault.line()


def test_on_error_skip_leaves_the_faulty_conversations_out(tmp_path):
    paths = write_chat_dataset(str(tmp_path / "chat"), plants={7: PLANTS[7], 10: PLANTS[10]})
    data = data_config(os.path.dirname(paths[0]), on_error="skip", max_skipped=2)
    pipeline = Pipeline.from_config(config_from_dict({"data": data}).data)
    assert sum(1 for _ in pipeline.build()) == 2 * PER_SHARD - 2
    assert pipeline.skipped.by_kind() == {"misaligned_weights": 1, "no_weighted_token": 1}


def test_a_set_with_the_weights_inside_its_tokens_is_checked_alike(tmp_path):
    """What convert --from chat writes: `weighted_tokens`, each 2 * id + weight. The faults that form can hold (a
    conversation without an answer, a split end of turn, a mask shifted either way) are named as in the two-key
    form, and the ids meet the vocabulary as ids, not as 2 * id + weight."""
    plants = {record: PLANTS[record] for record in (7, 9, 10, 11)}
    paths = write_chat_dataset(str(tmp_path / "chat"), plants=plants,
                               chat={**CHAT, "feature": WEIGHTED_TOKENS},
                               features={WEIGHTED_TOKENS: FEATURES["tokens"]})
    for path in paths:  # each record's two lists as one
        records = [tf.train.Example.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(path)]
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                tokens = record.features.feature["tokens"].int64_list.value
                weights = record.features.feature[LOSS_WEIGHTS].int64_list.value
                values = [2 * token + weight for token, weight in zip(tokens, weights)]
                feature = {WEIGHTED_TOKENS: tf.train.Feature(int64_list=tf.train.Int64List(value=values))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    report = verify(os.path.dirname(paths[0]), features={WEIGHTED_TOKENS: FEATURES["tokens"]},
                    preprocess=[{"op": "lm_shift", "key": WEIGHTED_TOKENS}])
    assert [(f.record, f.kind) for f in report.faults] == [(record, kind) for record, (_, kind) in plants.items()], \
        report.table()
    what = {f.record: f.what for f in report.faults}
    assert what[10] == "the weighted run at positions 16..19 ends on token 32, not the end of turn <|im_end|> " \
                       "(id 260); 1 of the record's 1 weighted run(s) miss it"
    assert report.notes == [
        f"token ids of 'weighted_tokens' checked against vocab_size {VOCAB} (metadata.json tokenizer)",
        "a chatml chat set (metadata.json chat): the weights inside 'weighted_tokens' (2 * id + weight) checked, at "
        "least one weighted token per conversation, each run of them ending on its end of turn <|im_end|> (id 260)"]
