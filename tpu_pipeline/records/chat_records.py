"""Chat and instruction records → `weighted_tokens` tf.Examples: what `convert --from chat` writes.

A record is one of three schemas, detected from the first record of the input (`detect_schema`):

- `messages`: a list of `{role, content}` (roles system, user, assistant, tool; a content given as a list of
  `{type: text, text}` parts is joined), the chat format of OpenAI, TRL and the hub;
- `prompt` / `completion`: one exchange (TRL's; a prompt that is itself a list of messages is taken as one);
- `question` / `answer`: one exchange.

Each conversation is rendered with the chat template and tokenized whole (format/chat_encoding.py); its
loss weights are 1 on every assistant answer and its end-of-turn token, 0 elsewhere, and each token is written
with its weight inside it: `weighted_tokens`, `2 * id + weight` (one int64 list a record, not two: parsed and
packed, weighted rows cost about what plain ones do; ops/weighted_values.py). `loss_on: all` writes plain
`tokens`, no weights: every token is trained on. A conversation longer than `max_tokens` is truncated by dropping its
oldest exchanges whole (a user turn and the turns that answer it; the system message stays), never cutting
inside a turn, or dropped (`overlong: drop`, or when even its last exchange does not fit); both are counted in
metadata.json. A conversation with no answer to learn from is an ItemError (`--on_error skip` counts it), unless every token is
trained on (`loss_on: all`).
"""
from __future__ import annotations

import collections
import collections.abc
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from tpu_pipeline.config.data import WEIGHTED_TOKENS
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.chat_encoding import ChatEncoder
from tpu_pipeline.format.chat_template import ROLES, ChatTemplate, Rendered
from tpu_pipeline.format.tokenizer import Tokenizer
from tpu_pipeline.records.chat_flat import FlatChatML
from tpu_pipeline.records.convert_input import Encoded, ItemError
from tpu_pipeline.records.token_records import FEATURE, TokenRecords, token_examples

Result = tuple[Union[Encoded, None], Optional[ItemError]]
SCHEMAS = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"),
           "question_answer": ("question", "answer")}
LOSS_ON = ("answers", "all")
OVERLONG = ("truncate", "drop")


def detect_schema(fields: Sequence[str], where: str) -> str:
    """The schema whose fields the first record holds (messages first: a record may hold both)."""
    for name, needed in SCHEMAS.items():
        if all(field in fields for field in needed):
            return name
    raise ConfigError(f"{where}: no chat schema fits its fields {sorted(fields)[:20]}: give `messages` (a list of "
                      "{role, content}), `prompt` and `completion`, or `question` and `answer`")


def _content(value: Any, where: str, turn: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        kinds = {p.get("type") for p in value} - {"text"}
        if not kinds:
            return "".join(str(p.get("text") or "") for p in value)
        raise ItemError(where, f"message {turn} holds parts of type {sorted(map(str, kinds))}; only text is converted")
    raise ItemError(where, f"message {turn}'s content is a {type(value).__name__}, not a string")


def to_messages(record: Mapping[str, Any], schema: str, where: str, need_answer: bool = True) -> list[dict[str, str]]:
    """A record of `schema` as a checked list of {role, content}, with an assistant turn where `need_answer`."""
    fields = SCHEMAS[schema]
    missing = [f for f in fields if record.get(f) is None]
    if missing:
        raise ItemError(where, f"no field(s) {missing} (its fields: {sorted(record)[:20]}); every record of a "
                               f"{schema} set needs {' and '.join(fields)}")
    if schema == "messages":
        raw = record["messages"]
    else:
        prompt, answer = record[fields[0]], record[fields[1]]
        raw = (list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}])
        raw = raw + (list(answer) if isinstance(answer, list) else [{"role": "assistant", "content": answer}])
    if not isinstance(raw, list) or not raw:
        raise ItemError(where, f"field {fields[0]!r} must be a non-empty list of {{role, content}}")
    messages = []
    for turn, message in enumerate(raw, 1):
        # dict first: typing.Mapping's isinstance costs ~13 µs, more than the rest of a message's checks
        if not (isinstance(message, dict) or isinstance(message, collections.abc.Mapping)) \
                or "role" not in message or "content" not in message:
            raise ItemError(where, f"message {turn} is not a {{role, content}} object")
        role = message["role"]
        if role not in ROLES:
            raise ItemError(where, f"message {turn} has role {role!r}; roles are {', '.join(ROLES)}")
        messages.append({"role": role, "content": _content(message["content"], where, turn)})
    if need_answer and not any(m["role"] == "assistant" for m in messages):
        raise ItemError(where, "no assistant turn: nothing to learn from; drop the record, or keep it with "
                               "--on_error skip (counted)")
    return messages


class ChatRecords(TokenRecords):
    """Conversations → one record each (`weighted_tokens`), and the chat entry of metadata.json."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, *, schema: str, loss_on: str = "answers",
                 max_tokens: int = 65_536, overlong: str = "truncate", tokenizer_spec: str = "") -> None:
        if loss_on not in LOSS_ON:
            raise ConfigError(f"--loss_on must be {' or '.join(LOSS_ON)} (given: {loss_on!r})")
        if overlong not in OVERLONG:
            raise ConfigError(f"--overlong must be {' or '.join(OVERLONG)} (given: {overlong!r})")
        if max_tokens < 1:
            raise ConfigError(f"--max_conversation_tokens must be >= 1 (given: {max_tokens})")
        super().__init__(tokenizer, 0)
        self.template, self.schema, self.loss_on = template, schema, loss_on
        self.max_tokens, self.overlong = int(max_tokens), overlong
        self.encoder = ChatEncoder(template, tokenizer, tokenizer_spec)
        self.flat = FlatChatML.of(self, SCHEMAS[schema])  # None where the flat way does not apply

    def encode_many(self, records: Sequence[Mapping[str, Any]], wheres: Sequence[str]) -> list[Result]:
        """Each record's (Encoded, None) or (None, ItemError), in order. ChatML with the byte-level tokenizer goes
        the flat way (records/chat_flat.py: the same records, from arrays); any other, `encode_rows`."""
        if self.flat is not None:
            return self.flat.encode_records(records, wheres)
        return self.encode_rows(records, wheres)

    def encode_rows(self, records: Sequence[Mapping[str, Any]], wheres: Sequence[str]) -> list[Result]:
        """`encode_many` a record at a time: rendered one by one, then tokenized and serialized as one batch (a
        record at a time, the array work per record cost more than the rest)."""
        out: list[Result] = [(None, None)] * len(records)
        rendered, rows, conversations = [], [], []
        for row, (record, where) in enumerate(zip(records, wheres)):
            try:
                messages = to_messages(record, self.schema, where, need_answer=self.loss_on == "answers")
                rendered.append(self._render(messages, where))
            except ItemError as error:
                out[row] = (None, error)
                continue
            rows.append(row)
            conversations.append(messages)
        return self.finish(out, rows, self.encoder.encode_many(rendered), wheres,
                           lambda k: self._shortened(conversations[k], wheres[rows[k]]))

    def finish(self, out: list[Result], rows: Sequence[int], encoded: tuple[np.ndarray, np.ndarray, np.ndarray],
               wheres: Sequence[str], shortened: Callable[[int], Result]) -> list[Result]:
        """`out[rows[k]]` for each conversation k of `encoded` (ids, weights, bounds: conversation k is
        [bounds[k], bounds[k + 1])): its record, or an error; `shortened(k)`: the result of an over-long one."""
        ids, weights, bounds = encoded
        lengths = np.diff(bounds)
        covered = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
        weighted = covered[bounds[1:]] - covered[bounds[:-1]] if self.loss_on == "answers" else lengths
        good = []
        for k, row in enumerate(rows):
            if lengths[k] > self.max_tokens:
                out[row] = shortened(k)
            elif not weighted[k] or not lengths[k]:
                out[row] = (None, ItemError(wheres[row], "no weighted token: every assistant answer is empty; drop "
                                                         "the record" if lengths[k] else "the template rendered nothing"))
            else:
                good.append(k)
        if good:
            chosen = np.zeros(len(rows), bool)
            chosen[good] = True
            kept = np.repeat(chosen, lengths)
            examples = token_examples(self._written(ids[kept], weights[kept]),
                                      np.concatenate([[0], np.cumsum(lengths[good])]), name=self.feature)
            for example, k in zip(examples, good):
                out[rows[k]] = (Encoded((example,), self._chat_stats(int(lengths[k]), int(weighted[k]), 0)), None)
        return out

    @property
    def feature(self) -> str:
        """The one feature a record holds: `weighted_tokens` (2 * id + weight), or `tokens` for `loss_on: all`."""
        return WEIGHTED_TOKENS if self.loss_on == "answers" else FEATURE

    def _written(self, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return ids * 2 + weights.astype(np.int64, copy=False) if self.loss_on == "answers" else ids

    @staticmethod
    def _chat_stats(length: int, weighted: int, dropped_turns: int) -> dict[str, int]:
        return {"documents": 1, "tokens": length, "max_tokens": length, "weighted_tokens": weighted,
                "truncated": int(dropped_turns > 0), "dropped_turns": dropped_turns}

    def _shortened(self, messages: list[dict[str, str]], where: str) -> Result:
        """An over-long conversation without its oldest exchanges, whole (`overlong: truncate`), or dropped."""
        dropped_turns = 0
        ids = np.empty(0, np.int64)
        while dropped_turns == 0 or len(ids) > self.max_tokens:
            shorter = self._without_oldest_exchange(messages) if self.overlong == "truncate" else None
            if shorter is None:
                return Encoded((), {"dropped_long": 1}), None
            dropped_turns += len(messages) - len(shorter)
            messages = shorter
            try:
                ids, weights = self.encoder.encode(self._render(messages, where))
            except ItemError as error:
                return None, error
        weighted = int(weights.sum()) if self.loss_on == "answers" else len(ids)
        if not weighted:
            return None, ItemError(where, "no weighted token left after dropping its oldest exchanges to fit "
                                          f"--max_conversation_tokens {self.max_tokens}")
        example, = token_examples(self._written(ids, weights), np.array([0, len(ids)], np.int64), name=self.feature)
        return Encoded((example,), self._chat_stats(len(ids), weighted, dropped_turns)), None

    def _render(self, messages: list[dict[str, str]], where: str) -> Rendered:
        try:
            return self.template.render(messages, where)
        except DataError as error:
            reason = str(error)
            raise ItemError(where, reason[len(where) + 2:] if reason.startswith(f"{where}: ") else reason) from None

    @staticmethod
    def _without_oldest_exchange(messages: list[dict[str, str]]) -> Optional[list[dict[str, str]]]:
        """The conversation without its oldest exchange (a user turn and the turns up to the next user turn); the
        leading system message stays. None when only one exchange is left."""
        head = 1 if messages and messages[0]["role"] == "system" else 0
        users = [i for i in range(head, len(messages)) if messages[i]["role"] == "user"]
        if len(users) < 2:
            return None
        return messages[:head] + messages[users[1]:]

    # --- metadata.json ----------------------------------------------------------------------------

    def split_metadata(self, shard_stats: list[dict[str, int]], with_text: bool = False) -> dict[str, Any]:
        total: collections.Counter = collections.Counter()
        for stats in shard_stats:
            total.update(stats)
        entry = super().split_metadata(shard_stats, with_text=False)
        entry.update({
            "num_conversations": total["documents"], "num_weighted_tokens": total["weighted_tokens"],
            # Over --max_conversation_tokens: shortened by whole exchanges, or dropped (counted, not written).
            "num_truncated_conversations": total["truncated"], "num_dropped_turns": total["dropped_turns"],
            "num_dropped_long_conversations": total["dropped_long"],
        })
        return entry

    def chat_entry(self) -> dict[str, Any]:
        return {**self.encoder.describe(), "schema": self.schema, "loss_on": self.loss_on, "feature": self.feature,
                "max_conversation_tokens": self.max_tokens, "overlong": self.overlong}

    def extra_metadata(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.describe(), "chat": self.chat_entry()}

    def features(self) -> dict[str, dict[str, Any]]:
        return {self.feature: {"dtype": "int64", "kind": "ragged"}}

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "chat": {**self.chat_entry(), "template_source": self.template.source}}
