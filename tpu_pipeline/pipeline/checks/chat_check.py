"""Checking a chat (instruction) record's loss mask against its tokens: what `verify` adds for a dataset
whose metadata.json has a `chat` entry (`convert --from chat`), called per record by `record_check.FileChecker`.

A record is one rendered conversation: `weighted_tokens`, each token `2 * id + weight` (weight 1 on what the
model learns, the assistant's answers and their end-of-turn token; 0 elsewhere), or, as sets written before
and users' own are, `tokens` and `loss_weights` beside them (one per token); `chat.loss_on` "all" writes plain
`tokens` (every token is trained). A wrong mask trains without an error and looks fine in a log, so it is
checked here, in this order, the first fault a record's:

1. weights present when loss_on is "answers", one per token (`loss_weights`: by construction in
   `weighted_tokens`);
2. every weight 0 or 1 (`loss_weights`; this one for any config whose features hold `loss_weights` too);
3. at least one weight 1: a conversation without an assistant answer teaches nothing (`no_weighted_token`);
4. the template's end-of-turn id (`chat.end_of_turn_id`, when known) in the record (`no_end_of_turn`: the
   tokenizer split the template's special tokens), and every maximal run of weight-1 tokens ending on it
   (`misaligned_weights`).

Check 4 is the one for the bug chat masks have most: a mask one token off its tokens. Shifted one token
left, each answer's run starts on the last token of the assistant header and ends before the end of turn;
shifted right, it ends on the token after it. Either way every run ends on a token other than the end of
turn, which counts and 0/1 values cannot see.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS
from tpu_pipeline.config.features import FeatureConfig
from tpu_pipeline.format.example_check import Record, context_features, token_ids
from tpu_pipeline.format.metadata import read_metadata

TOKENS = "tokens"  # the ids beside `loss_weights` (sets written before `weighted_tokens`, users' own; loss_on all)

FIXES = {
    "loss_weights": "write one loss weight per token, 1 on the assistant's answers and their end of turn, 0 elsewhere: "
                    "convert the chat data again (convert --from chat)",
    "no_weighted_token": "drop it, or convert with --loss_on all",
    "no_end_of_turn": "the tokens were not made by a tokenizer that keeps the template's special tokens whole "
                      "(metadata.json chat.special_tokens): convert again with the tokenizer the template was made for",
    "misaligned_weights": "each answer's weights must end on its end of turn (where the model learns to stop); a mask "
                          "one token off trains on the prompt: convert the chat data again (convert --from chat)",
}


@dataclasses.dataclass(frozen=True)
class ChatSpec:
    """metadata.json's `chat` entry, as far as checking a record needs it."""

    template: str
    loss_on: str  # "answers" (loss_weights written) or "all" (none: every token trained)
    end_of_turn: Optional[str]
    end_of_turn_id: Optional[int]  # None: the template's end of turn is unknown, so check 4 is not made
    feature: str = LOSS_WEIGHTS  # where the weights are: `weighted_tokens` (inside the ids), or `loss_weights`

    @property
    def weighted(self) -> bool:
        return self.loss_on != "all"

    def turn_end(self) -> str:
        name = f"{self.end_of_turn} " if self.end_of_turn else ""
        return f"end of turn {name}(id {self.end_of_turn_id})"


def chat_note(specs: Sequence[Optional[ChatSpec]]) -> Optional[str]:
    """What verify says once about the chat checks made (`specs`: each file's), so that "no fault found" on a chat
    set says its loss masks were read too; None when no file is chat data."""
    found = sorted({spec for spec in specs if spec is not None}, key=repr)
    if not found:
        return None
    said = []
    for spec in found:
        known = spec.end_of_turn_id is not None
        if not spec.weighted:
            said.append(f"a {spec.template} chat set trained on every token (loss_on all): " + (
                f"each conversation's {spec.turn_end()} checked" if known else "its end of turn unknown, not checked"))
            continue
        turn = f", each run of them ending on its {spec.turn_end()}" if known else ""
        inside = spec.feature == WEIGHTED_TOKENS
        weights = (f"the weights inside {WEIGHTED_TOKENS!r} (2 * id + weight) checked" if inside
                   else f"{LOSS_WEIGHTS!r} checked, 0 or 1, one per token")
        said.append(f"a {spec.template} chat set (metadata.json chat): {weights}, at least one weighted token per "
                    f"conversation{turn}")
    files = sum(spec is not None for spec in specs)
    where = f" ({files} of {len(specs)} file(s))" if files < len(specs) else ""
    return "; ".join(said) + where


def chat_spec(metadata: Optional[Mapping[str, Any]]) -> Optional[ChatSpec]:
    """The `chat` entry of a dataset's metadata.json; None for a dataset that is no chat data."""
    chat = (metadata or {}).get("chat")
    if not isinstance(chat, Mapping):
        return None
    end_id = chat.get("end_of_turn_id")
    end_id = end_id if isinstance(end_id, int) and not isinstance(end_id, bool) else None
    end = chat.get("end_of_turn")
    feature = WEIGHTED_TOKENS if chat.get("feature") == WEIGHTED_TOKENS else LOSS_WEIGHTS
    return ChatSpec(str(chat.get("template") or "?"), str(chat.get("loss_on") or "answers"),
                    end if isinstance(end, str) else None, end_id, feature)


class DatasetChats:
    """Each file's ChatSpec from the metadata.json beside it, when that metadata lists the file (as
    `vocabularies.dataset_vocabularies` finds a tokenizer); read once per directory, shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_dir: dict[str, tuple[Optional[ChatSpec], frozenset[str]]] = {}

    def __call__(self, path: str) -> Optional[ChatSpec]:
        directory, name = os.path.split(path)
        with self._lock:
            if directory not in self._by_dir:
                self._by_dir[directory] = _dataset_chat(directory)
            spec, listed = self._by_dir[directory]
        return spec if name in listed else None


def _dataset_chat(directory: str) -> tuple[Optional[ChatSpec], frozenset[str]]:
    try:
        metadata = read_metadata(directory)
    except (OSError, ValueError, tf.errors.OpError):
        return None, frozenset()  # not a converted dataset's metadata
    spec = chat_spec(metadata)
    if spec is None:
        return None, frozenset()
    splits = (metadata or {}).get("splits") or {}
    return spec, frozenset(name for entry in splits.values() if isinstance(entry, Mapping)
                           for name in entry.get("files") or [])


class ChatFault(NamedTuple):
    kind: str
    what: str
    fix: str


_RAGGED = FeatureConfig(dtype="int64", kind="ragged")  # how a feature the spec does not declare is read


def _stored_kind(example: Record, name: str) -> Optional[str]:
    """The list kind a context feature is stored as (int64_list, float_list, bytes_list), None when absent."""
    stored = context_features(example)
    return stored[name].WhichOneof("kind") if name in stored else None


def chat_fault(example: Record, features: Mapping[str, Any], chat: Optional[ChatSpec]) -> Optional[ChatFault]:
    """The first fault of one record's loss mask (module docstring); `chat` None: only the 0/1 check, for a
    config whose features hold `loss_weights`. Dtypes the spec declares are `misfit`'s, checked before."""
    folded = token_ids(example, WEIGHTED_TOKENS, features.get(WEIGHTED_TOKENS) or _RAGGED)
    if folded is not None:  # each token 2 * id + weight: one weight per token, 0 or 1, by construction
        return _mask_fault(folded >> 1, folded & 1, chat)
    declared = features.get(LOSS_WEIGHTS)
    if declared is not None and declared.dtype != "int64":
        return None  # float weights: a weighting the user chose, not a 0/1 mask
    weights_spec = declared or _RAGGED
    stored = _stored_kind(example, LOSS_WEIGHTS) if weights_spec.kind != "sequence" else "int64_list"
    if stored not in (None, "int64_list"):
        return ChatFault("loss_weights", f"feature {LOSS_WEIGHTS!r} stores {stored.split('_')[0]} values, not "
                         "int64 0/1 weights", FIXES["loss_weights"])
    weights = token_ids(example, LOSS_WEIGHTS, weights_spec)
    tokens = token_ids(example, TOKENS, features.get(TOKENS) or _RAGGED) if chat is not None else None
    if chat is not None and chat.weighted:
        if weights is None:
            return ChatFault("loss_weights", f"has no feature {chat.feature!r}, which metadata.json chat.loss_on "
                             f"{chat.loss_on!r} says every record holds (one weight per token)", FIXES["loss_weights"])
        if tokens is not None and weights.size != tokens.size:
            return ChatFault("loss_weights", f"feature {LOSS_WEIGHTS!r} holds {weights.size} weight(s) for the "
                             f"{tokens.size} token(s) of {TOKENS!r}; one weight per token", FIXES["loss_weights"])
    if weights is not None and weights.size:
        bad = np.flatnonzero((weights != 0) & (weights != 1))
        if bad.size:
            at = int(bad[0])
            return ChatFault("loss_weights", f"weight {int(weights[at])} at position {at} of feature {LOSS_WEIGHTS!r} "
                             "is not 0 or 1", FIXES["loss_weights"])
    return _mask_fault(tokens, weights, chat)


def _mask_fault(tokens: Optional[np.ndarray], weights: Optional[np.ndarray], chat: Optional[ChatSpec]
                ) -> Optional[ChatFault]:
    """Checks 3 and 4 (module docstring) of one record's ids and 0/1 weights (None: loss_on all)."""
    if chat is None or tokens is None or not tokens.size:
        return None  # no chat data, or no tokens (an empty document is the token check's)
    if chat.weighted and weights is not None and not weights.any():
        return ChatFault("no_weighted_token", "no weighted token: a conversation without an assistant answer",
                         FIXES["no_weighted_token"])
    if chat.end_of_turn_id is None:
        return None
    end = chat.end_of_turn_id
    if not (tokens == end).any():
        return ChatFault("no_end_of_turn", f"holds no {chat.turn_end()} of template {chat.template!r}",
                         FIXES["no_end_of_turn"])
    if weights is None or weights.size != tokens.size:
        return None  # loss_on all: nothing to align
    # Each maximal run of 1s must end on the end of turn: a mask shifted one token (the bug chat masks have
    # most) ends every answer's run one token before or after it, which counts and 0/1 values cannot show.
    ones = weights.astype(bool)
    starts = np.flatnonzero(ones & ~np.concatenate([[False], ones[:-1]]))
    ends = np.flatnonzero(ones & ~np.concatenate([ones[1:], [False]]))
    wrong = np.flatnonzero(tokens[ends] != end)
    if wrong.size:
        first = int(wrong[0])
        start, stop = int(starts[first]), int(ends[first])
        return ChatFault("misaligned_weights", f"the weighted run at positions {start}..{stop} ends on token "
                         f"{int(tokens[stop])}, not the {chat.turn_end()}; {wrong.size} of the record's "
                         f"{ends.size} weighted run(s) miss it",
                         FIXES["misaligned_weights"])
    return None
