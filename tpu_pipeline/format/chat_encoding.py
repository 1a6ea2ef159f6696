"""A rendered conversation → token ids and a loss weight per token, with its template and tokenizer checked to agree.

The whole text is tokenized at once, as the model will read it at inference (tokenizing the prompt and the
answer apart would give a subword tokenizer other tokens at their boundary), and each token is weighted 1 when
it covers a character of an answer span (`chat_template.Rendered`). Every tokenizer says where each token lies:
the byte-level one and SentencePiece in UTF-8 bytes, a tokenizer.json in characters.

Agreement, checked once before anything is converted: each special token the template writes must be one id of
the tokenizer (a tokenizer that spells `<|im_end|>` as seven byte-pieces never learns where a turn ends), the
id a tokenizer_config.json gives it must be the tokenizer's, and so must its EOS. Each disagreement is one line
naming the template, the tokenizer and the token.
"""
from __future__ import annotations

import re
from typing import Any, Sequence, Union

import numpy as np

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.chat_template import ChatTemplate, Rendered
from tpu_pipeline.format.tokenizer import BYTE_OFFSET, ByteTokenizer, IdsTokenizer, Tokenizer, load_tokenizer, overlapping, single_id


def _describe(tokenizer: Tokenizer, spec: str) -> str:
    return spec if spec else tokenizer.name


def chat_tokenizer(spec: Union[str, Tokenizer], template: ChatTemplate) -> Tokenizer:
    """The tokenizer named by --tokenizer; the byte-level one gets the template's special tokens as ids 259, ..."""
    tokenizer = load_tokenizer(spec) if isinstance(spec, str) else spec
    if isinstance(tokenizer, ByteTokenizer) and not tokenizer.added_tokens:
        return ByteTokenizer(template.special_tokens)
    if isinstance(tokenizer, IdsTokenizer):
        raise ConfigError("--from chat: conversations are text; give a tokenizer (bytes, spm:..., hf:...)")
    return tokenizer


class ChatEncoder:
    """Renders and tokenizes conversations; `special_ids` maps each of the template's special tokens to its id."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, spec: str = "") -> None:
        self.template, self.tokenizer = template, tokenizer
        name = _describe(tokenizer, spec)
        self.special_ids: dict[str, int] = {}
        for token in template.special_tokens:
            found = single_id(tokenizer, token)
            if found is None:
                count = len(tokenizer.encode(token))
                raise ConfigError(
                    f"chat template {template.name} writes the special token {token!r}, which tokenizer {name} spells "
                    f"out as {count} ids instead of holding it as one: use the tokenizer this template came with, or a "
                    "template written for this tokenizer")
            expected = template.special_ids.get(token)
            if expected is not None and expected != found:
                raise ConfigError(f"chat template {template.name} gives {token!r} id {expected}, but tokenizer {name} "
                                  f"gives it id {found}: give the tokenizer.json of the same model as the template")
            self.special_ids[token] = found
        eos = template.eos_token
        if eos and eos in template.special_tokens and not isinstance(tokenizer, ByteTokenizer) and tokenizer.eos_id is not None and self.special_ids[eos] != tokenizer.eos_id:
            raise ConfigError(f"chat template {template.name} ends sequences with {eos!r} (id {self.special_ids[eos]}), but "
                              f"tokenizer {name}'s EOS is id {tokenizer.eos_id}: give the files of one model")
        self.end_of_turn_id = self.special_ids.get(template.end_of_turn) if template.end_of_turn else None
        self._byte_ids = {token.encode("utf-8"): i for token, i in self.special_ids.items()}
        self._byte_split = (re.compile(b"|".join(re.escape(t) for t in sorted(self._byte_ids, key=len, reverse=True)))
                            if self._byte_ids else None)

    def describe(self) -> dict[str, Any]:
        return {**self.template.describe(), "special_tokens": dict(self.special_ids), "end_of_turn_id": self.end_of_turn_id}

    def encode(self, rendered: Rendered) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, weights uint8): a weight of 1 on each token covering a character of an answer span."""
        ids, weights, _ = self.encode_many([rendered])
        return ids, weights

    def encode_many(self, rendered: Sequence[Rendered]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Many conversations at once: (ids, weights, bounds), conversation i being [bounds[i], bounds[i+1])."""
        if isinstance(self.tokenizer, ByteTokenizer) and self.tokenizer.added_ids == self.special_ids:
            return self._encode_bytes(rendered)
        pairs = [self.encode_by_offsets(r) for r in rendered]
        bounds = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in pairs])]).astype(np.int64)
        if not pairs:
            return np.empty(0, np.int64), np.empty(0, np.uint8), bounds
        return np.concatenate([i for i, _ in pairs]), np.concatenate([w for _, w in pairs]), bounds

    def _encode_bytes(self, rendered: Sequence[Rendered]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`encode_by_offsets` for the byte-level tokenizer, for a batch of conversations in one buffer and a few
        array operations (a test compares the two): the UTF-8 bytes as ids, each special token's bytes folded
        into its one id, weighted where it overlaps an answer."""
        texts = [r.text for r in rendered]
        ascii_only = all(t.isascii() for t in texts)
        raw = "".join(texts).encode("utf-8")
        sizes = [len(t) for t in texts] if ascii_only else [len(t.encode("utf-8")) for t in texts]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        ids = np.frombuffer(raw, np.uint8).astype(np.int64) + BYTE_OFFSET
        opens, closes = [], []
        for at, text, r in zip(starts.tolist(), texts, rendered):
            for start, end in r.spans:
                if not ascii_only and not text.isascii():
                    start, end = len(text[:start].encode("utf-8")), len(text[:end].encode("utf-8"))
                opens.append(at + start)
                closes.append(at + end)
        edges = np.zeros(len(raw) + 1, np.int32)
        np.add.at(edges, np.asarray(opens, np.int64), 1)
        np.add.at(edges, np.asarray(closes, np.int64), -1)
        weights = (np.cumsum(edges[:-1]) > 0).astype(np.uint8)
        if self._byte_split is None:
            return ids, weights, starts
        found = [(m.start(), m.end(), self._byte_ids[m.group()]) for m in self._byte_split.finditer(raw)]
        if not found:
            return ids, weights, starts
        first, last, special = (np.asarray(column, np.int64) for column in zip(*found))
        covered = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
        weights[first] = (covered[last] - covered[first]) > 0
        ids[first] = special
        inner = np.zeros(len(raw) + 1, np.int32)  # each special token's bytes after its first: dropped
        np.add.at(inner, first + 1, 1)
        np.add.at(inner, last, -1)
        keep = np.cumsum(inner[:-1]) == 0
        kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
        return ids[keep], weights[keep], kept[starts]

    def encode_by_offsets(self, rendered: Rendered) -> tuple[np.ndarray, np.ndarray]:
        """Any tokenizer: the whole text's tokens and where each lies, weighted where it overlaps an answer span."""
        text = rendered.text
        ids, starts, ends = self.tokenizer.encode_offsets(text)  # type: ignore[attr-defined]
        in_bytes = self.tokenizer.name in ("bytes", "sentencepiece")
        size = len(text.encode("utf-8")) if in_bytes else len(text)
        weighted = np.zeros(size, np.uint8)
        for start, end in rendered.spans:
            if in_bytes and not text.isascii():
                start, end = len(text[:start].encode("utf-8")), len(text[:end].encode("utf-8"))
            weighted[start:end] = 1
        return np.asarray(ids, np.int64), overlapping(starts, ends, weighted)
