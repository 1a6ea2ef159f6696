"""ChatML conversations and the byte-level tokenizer, encoded from flat arrays: the records `ChatRecords` writes
record by record, without a rendered text per conversation (issue 50, item 7: chat conversion as fast per token as
text conversion).

With the built-in ChatML template and the byte-level tokenizer holding its special tokens, a conversation's ids
are fixed pieces around each message's bytes: `<|im_start|>`, the role's bytes, a newline, the content's bytes,
`<|im_end|>`, a newline; an assistant turn's content and its `<|im_end|>` are weighted. So a batch of
conversations is its messages' roles and contents, and its ids and weights are a few array operations over the
contents' UTF-8 bytes: read from Arrow's buffers for Parquet (no Python object per row), joined once for JSON lines.

A conversation this cannot encode exactly as the record-by-record path does goes that path instead, whole
(`ChatRecords.encode_rows`): a record that is not a non-empty list of {role: str, content: str} with known roles
(its error is that path's), one without an answer where one is needed, one whose content holds a special token's
text (which the tokenizer folds into the token's id there), one longer than --max_conversation_tokens (shortened
there). tests/test_chat_flat.py checks that both paths write the same bytes.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tpu_pipeline.format.chat_template import DIRECT, ROLES
from tpu_pipeline.format.tokenizer import BYTE_OFFSET, ByteTokenizer

_ROLE_CODES = {role: code for code, role in enumerate(ROLES)}
_USER, _ASSISTANT = _ROLE_CODES["user"], _ROLE_CODES["assistant"]
_NEWLINE = ord("\n") + BYTE_OFFSET
_STRINGS = (pa.string(), pa.large_string())


class FlatChatML:
    """Encodes batches of conversations the flat way; `of(records, fields)` is None where it does not apply."""

    def __init__(self, records: Any, fields: Sequence[str]) -> None:
        self.records, self.fields = records, tuple(fields)
        self.need_answer = records.loss_on == "answers"
        self.start_id = records.encoder.special_ids["<|im_start|>"]
        self.end_id = records.encoder.special_ids["<|im_end|>"]
        self.specials = tuple(records.encoder.special_ids)
        self.role_ids = [np.frombuffer(role.encode(), np.uint8).astype(np.int64) + BYTE_OFFSET for role in ROLES]
        self.role_lengths = np.array([len(role) for role in ROLES], np.int64)

    @classmethod
    def of(cls, records: Any, fields: Sequence[str]) -> Optional["FlatChatML"]:
        encoder = records.encoder
        applies = (records.template.direct is DIRECT["chatml"] and isinstance(encoder.tokenizer, ByteTokenizer)
                   and encoder.tokenizer.added_ids == encoder.special_ids)
        return cls(records, fields) if applies else None

    # --- the two ways in ---------------------------------------------------------------------------------

    def encode_records(self, records: Sequence[Mapping[str, Any]], wheres: Sequence[str]) -> list:
        """Records as Python values (JSON lines, or Parquet rows of another schema)."""
        roles: list[int] = []
        contents: list[str] = []
        counts: list[int] = []
        fits: list[int] = []
        for row, record in enumerate(records):
            found = self._messages(record)
            if found is None:
                continue
            fits.append(row)
            counts.append(len(found))
            for role, content in found:
                roles.append(role)
                contents.append(content)
        joined = "".join(contents)
        chars = np.fromiter(map(len, contents), np.int64, len(contents))
        lengths = chars if joined.isascii() else np.fromiter(
            (len(c) if c.isascii() else len(c.encode("utf-8")) for c in contents), np.int64, len(contents))
        data = np.frombuffer(joined.encode("utf-8"), np.uint8)
        # A special token's text inside a content: that conversation goes record by record.
        message_starts = np.cumsum(chars) - chars
        special = np.zeros(len(contents), bool)
        for token in self.specials:
            at = joined.find(token)
            while at >= 0:
                special[np.searchsorted(message_starts, at, side="right") - 1] = True
                at = joined.find(token, at + 1)
        return self._encode(lambda rows: [records[i] for i in rows], wheres, np.asarray(fits, np.int64),
                            np.asarray(counts, np.int64), np.asarray(roles, np.int64), np.cumsum(lengths) - lengths,
                            lengths, data, special)

    def encode_table(self, table: pa.Table, wheres: Sequence[str]) -> list:
        """A Parquet piece's rows, read from its Arrow buffers: a `messages` column of {role, content} strings, or a
        pair schema's two string columns; columns of other types as Python values."""
        found = self._table_messages(table) if self.fields == ("messages",) else self._table_pairs(table)
        if found is None:
            return self.encode_records(table.select(list(self.fields)).to_pylist(), wheres)
        selected = table.select(list(self.fields))
        return self._encode(lambda rows: selected.take(pa.array(rows, pa.int64())).to_pylist(), wheres, *found)

    def _table_messages(self, table: pa.Table) -> Optional[tuple[np.ndarray, ...]]:
        """`_encode`'s arrays of a `messages` column's rows whose messages all fit (None: not {role, content}
        strings)."""
        column = table.column(self.fields[0])
        kind = column.type
        if (not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type)
                or any(kind.value_type.get_field_index(name) < 0 or kind.value_type.field(name).type not in _STRINGS
                       for name in ("role", "content"))):
            return None
        lists = column.combine_chunks()
        counts = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        messages = pc.list_flatten(lists)
        contents = pc.struct_field(messages, "content")
        codes = pc.index_in(pc.struct_field(messages, "role"), value_set=pa.array(ROLES)).fill_null(-1).to_numpy(
            zero_copy_only=False)
        bad = (codes < 0) | ~_valid(messages) | ~_valid(contents)
        fits = _valid(lists) & (counts > 0) & (_per_row(bad, counts) == 0)
        rows, keep = np.flatnonzero(fits), np.repeat(fits, counts)
        offsets = _offsets(contents)
        return (rows, counts[rows], codes[keep].astype(np.int64), offsets[:-1][keep], np.diff(offsets)[keep],
                _data(contents), self._special(contents)[keep])

    def _table_pairs(self, table: pa.Table) -> Optional[tuple[np.ndarray, ...]]:
        """`_encode`'s arrays of a pair schema's rows with both strings (None: its columns are not strings)."""
        columns = [table.column(name).combine_chunks() for name in self.fields]
        if any(column.type not in _STRINGS for column in columns):
            return None
        rows = np.flatnonzero(_valid(columns[0]) & _valid(columns[1]))
        buffers = [_data(column) for column in columns]
        shifts = (0, len(buffers[0]))  # the answers' bytes follow the prompts' in one buffer
        offsets = [_offsets(column) for column in columns]
        begins = np.stack([found[:-1][rows] + shift for found, shift in zip(offsets, shifts)], axis=1).ravel()
        lengths = np.stack([np.diff(found)[rows] for found in offsets], axis=1).ravel()
        special = np.stack([self._special(column)[rows] for column in columns], axis=1).ravel()
        roles = np.tile(np.array([_USER, _ASSISTANT], np.int64), len(rows))
        return rows, np.full(len(rows), 2, np.int64), roles, begins, lengths, np.concatenate(buffers), special

    def _special(self, strings: pa.Array) -> np.ndarray:
        """Which strings hold a special token's text."""
        found = np.zeros(len(strings), bool)
        for token in self.specials:
            found |= pc.match_substring(strings, token).fill_null(False).to_numpy(zero_copy_only=False)
        return found

    # --- the arrays --------------------------------------------------------------------------------------

    def _messages(self, record: Any) -> Optional[list[tuple[int, str]]]:
        """(role code, content) of each message of a record that fits, as `to_messages` would take it; None if not."""
        if type(record) is not dict:
            return None
        if self.fields == ("messages",):
            raw = record.get("messages")
            if type(raw) is not list or not raw:
                return None
            found = []
            for message in raw:
                if type(message) is not dict:
                    return None
                role, content = message.get("role"), message.get("content")
                if type(role) is not str or type(content) is not str or role not in _ROLE_CODES:
                    return None
                found.append((_ROLE_CODES[role], content))
            return found  # one without an answer, where one is needed: `_encode` sends it record by record
        prompt, answer = record.get(self.fields[0]), record.get(self.fields[1])
        if type(prompt) is not str or type(answer) is not str:
            return None
        return [(_USER, prompt), (_ASSISTANT, answer)]

    def _encode(self, take: Callable[[np.ndarray], list], wheres: Sequence[str], fits: np.ndarray, counts: np.ndarray,
                roles: np.ndarray, begins: np.ndarray, lengths: np.ndarray, data: np.ndarray,
                special: np.ndarray) -> list:
        """Every record's result: those of rows `fits` (their messages' roles, and contents data[begins, +lengths),
        `counts` a row) from the arrays, unless one of its contents holds a special token; the rest record by record
        (`take(rows)`: those records as Python values)."""
        answered = _per_row(roles == _ASSISTANT, counts) > 0 if self.need_answer else np.ones(len(fits), bool)
        clean = answered & (_per_row(special, counts) == 0)
        if not clean.all():
            keep = np.repeat(clean, counts)
            fits, counts = fits[clean], counts[clean]
            roles, begins, lengths = roles[keep], begins[keep], lengths[keep]
        out: list = [(None, None)] * len(wheres)
        others = np.setdiff1d(np.arange(len(wheres)), fits)
        if others.size:
            results = self.records.encode_rows(take(others), [wheres[i] for i in others])
            for row, result in zip(others.tolist(), results):
                out[row] = result
        if not fits.size:
            return out

        def one_by_one(k: int) -> Any:  # an over-long conversation: shortened (or dropped) record by record
            return self.records.encode_rows(take(fits[k:k + 1]), [wheres[int(fits[k])]])[0]

        return self.records.finish(out, fits.tolist(), self._arrays(counts, roles, begins, lengths, data), wheres,
                                   one_by_one)

    def _arrays(self, counts: np.ndarray, roles: np.ndarray, begins: np.ndarray, lengths: np.ndarray,
                data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, weights, bounds) of the conversations, as `ChatEncoder.encode_many` gives them for their render."""
        role_lengths = self.role_lengths[roles]
        sizes = role_lengths + lengths + 4  # <|im_start|> role \n content <|im_end|> \n
        ends = np.cumsum(sizes)
        starts = ends - sizes
        ids = np.empty(int(ends[-1]) if len(ends) else 0, np.int64)
        ids[starts] = self.start_id
        for code, piece in enumerate(self.role_ids):
            at = starts[roles == code]
            if at.size:
                ids[at[:, None] + 1 + np.arange(piece.size)] = piece
        newline = starts + 1 + role_lengths
        ids[newline] = _NEWLINE
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        content = np.repeat(newline + 1, lengths) + within
        ids[content] = data[np.repeat(begins, lengths) + within].astype(np.int64) + BYTE_OFFSET
        end_of_turn = newline + 1 + lengths
        ids[end_of_turn] = self.end_id
        ids[end_of_turn + 1] = _NEWLINE
        weights = np.zeros(len(ids), np.uint8)
        answer = roles == _ASSISTANT
        weights[content[np.repeat(answer, lengths)]] = 1
        weights[end_of_turn[answer]] = 1
        bounds = np.concatenate([[0], ends[np.cumsum(counts) - 1]]).astype(np.int64)
        return ids, weights, bounds


def _per_row(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """How many of each row's messages are flagged (`counts` messages a row, in order)."""
    total = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    ends = np.cumsum(counts)
    return total[ends] - total[ends - counts]


def _valid(array: pa.Array) -> np.ndarray:
    return array.is_valid().to_numpy(zero_copy_only=False)


def _offsets(strings: pa.Array) -> np.ndarray:
    """int64 [n + 1]: string i is data[offsets[i]:offsets[i + 1]] (`_data`), the array's own offset applied."""
    width = np.int64 if strings.type == pa.large_string() else np.int32
    found = np.frombuffer(strings.buffers()[1], width)
    return found[strings.offset:strings.offset + len(strings) + 1].astype(np.int64)


def _data(strings: pa.Array) -> np.ndarray:
    buffer = strings.buffers()[2]
    return np.frombuffer(buffer, np.uint8) if buffer is not None else np.empty(0, np.uint8)
