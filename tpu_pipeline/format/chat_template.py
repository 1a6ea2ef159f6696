"""Chat templates: a conversation → the text a model reads, and the character spans its loss is taken on.

The ecosystem's convention is a Jinja `chat_template` (Hugging Face's `tokenizer_config.json`), rendered as
`transformers` renders it: a sandboxed environment with `trim_blocks` and `lstrip_blocks`, `raise_exception`,
a `tojson` that keeps non-ASCII text, and `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.

Which characters are the assistant's answer (the only ones trained on, by default) is found in one of two ways:

- a template with `{% generation %}...{% endgeneration %}` blocks (transformers' own marking, which its
  `return_assistant_tokens_mask` reads) says so itself: one render;
- any other template is rendered once per assistant turn, before it (with `add_generation_prompt`, so the
  header `<|im_start|>assistant\\n` is part of the prompt) and after it: what the turn added is its answer and
  end-of-turn text. A template whose earlier text changes with later turns cannot be read that way and is
  refused, naming the turn.

Trailing whitespace after an answer's end (ChatML's newline after `<|im_end|>`) is not weighted: a model never
predicts it at inference, where it stops at the end-of-turn token.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Callable, Optional, Sequence

from tpu_pipeline.errors import ConfigError, DataError

ROLES = ("system", "user", "assistant", "tool")
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use marks around {% generation %} output, removed after the render

# ChatML (Qwen's, OpenAI's): the canonical Hugging Face text, byte for byte.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turns, with Gemma 3's handling of a system message (folded into the first user turn) instead of
# Gemma 1's refusal, and its role check.
GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# The same two, with each answer and its end-of-turn token inside {% generation %}: the text they render is
# the canonical one (a test renders both), and one render finds the answers instead of two per turn.
CHATML_MARKED = CHATML.replace(
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}"
    "{% endif %}{{ '\n' }}")
GEMMA_MARKED = GEMMA.replace(
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}",
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}{% if role == 'model' %}"
    "{% generation %}{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] | trim + '<end_of_turn>' }}{% endif %}{{ '\n' }}")
assert CHATML_MARKED != CHATML and GEMMA_MARKED != GEMMA


@dataclasses.dataclass(frozen=True)
class Builtin:
    source: str
    special_tokens: tuple[str, ...]
    end_of_turn: str
    bos_token: str = ""
    eos_token: str = ""


BUILTINS = {
    "chatml": Builtin(CHATML_MARKED, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    "gemma": Builtin(GEMMA_MARKED, ("<bos>", "<start_of_turn>", "<end_of_turn>"), "<end_of_turn>", bos_token="<bos>",
                     eos_token="<eos>"),
}


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A conversation's text and the [start, end) character spans to weight, in order, not overlapping."""

    text: str
    spans: tuple[tuple[int, int], ...]


def _token_text(value: Any) -> str:
    """tokenizer_config.json writes a token as a string or as {"content": ...} (an AddedToken)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A Jinja chat template, its special tokens and its end-of-turn token, ready to render conversations."""

    def __init__(self, source: str, *, name: str, special_tokens: Sequence[str] = (), end_of_turn: str = "",
                 bos_token: str = "", eos_token: str = "", special_ids: Optional[dict[str, int]] = None) -> None:
        try:
            import jinja2
            from jinja2.ext import Extension, loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # a dependency of the package: only a broken install lacks it
            raise ConfigError("chat templates need jinja2: pip install 'jinja2>=3.1'") from None
        self.name, self.source = name, source
        self.bos_token, self.eos_token, self.end_of_turn = bos_token, eos_token, end_of_turn
        # Longest first: a regex alternation then matches "<|im_end|>" before a shorter token that prefixes it.
        self.special_tokens = tuple(sorted(dict.fromkeys(t for t in special_tokens if t), key=len, reverse=True))
        self.special_ids = dict(special_ids or {})  # what tokenizer_config.json says each id is, checked against the tokenizer
        self.sha256 = hashlib.sha256(source.encode()).hexdigest()

        class Generation(Extension):
            tags = {"generation"}

            def parse(self, parser):  # type: ignore[no-untyped-def]
                line = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(line)

            def _mark(self, caller):  # type: ignore[no-untyped-def]
                return _OPEN + caller() + _CLOSE

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[Generation, loopcontrols])
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        environment.globals["raise_exception"] = raise_exception
        try:
            self._template = environment.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise ConfigError(f"chat template {name}: not a Jinja template ({error.message}, line {error.lineno})") from None
        self._errors = (jinja2.exceptions.TemplateError, TypeError, KeyError, IndexError, AttributeError)
        self.marks_generation = "generation" in source and "endgeneration" in source
        self.direct: Optional[Callable[[Sequence[dict], str], Rendered]] = None  # a built-in's Python twin

    def describe(self) -> dict[str, Any]:
        return {"template": self.name, "template_sha256": self.sha256, "end_of_turn": self.end_of_turn or None,
                "marks": "generation" if self.marks_generation else "turns"}

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool, where: str) -> str:
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, tools=None)
        except self._errors as error:
            raise DataError(f"{where}: chat template {self.name} refused the conversation: {error}") from None

    def render(self, messages: Sequence[dict], where: str = "conversation") -> Rendered:
        """The text, and the spans of every assistant turn's answer and end-of-turn text. A built-in renders in
        plain Python (`direct`: the same text and spans as its Jinja source, which a test compares, at a
        twentieth of the cost: the template engine was most of a conversion's time)."""
        if self.direct is not None:
            return self.direct(messages, where)
        return self.render_jinja(messages, where)

    def prompt(self, messages: Sequence[dict], where: str = "conversation") -> str:
        """The text a model trained on this template continues with its answer to `messages`: their render with
        the template's generation prompt (`add_generation_prompt`, transformers' name), e.g. ChatML's
        `<|im_start|>assistant\n`. Sample from it until the end-of-turn id (metadata.json `chat.end_of_turn_id`)."""
        return self._render(messages, True, where).replace(_OPEN, "").replace(_CLOSE, "")

    def render_jinja(self, messages: Sequence[dict], where: str = "conversation") -> Rendered:
        """`render` through the template's Jinja source, always."""
        if self.marks_generation:
            return self._render_marked(messages, where)
        text = self._render(messages, False, where)
        spans = []
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:turn], True, where)
            after = self._render(messages[:turn + 1], False, where)
            if not (after.startswith(before) and text.startswith(after)):
                raise DataError(
                    f"{where}: chat template {self.name} changes earlier text as turns are added (at turn {turn + 1}), "
                    "so the answers cannot be told from the rest; mark them in the template with "
                    "{% generation %}...{% endgeneration %} (transformers' convention)")
            end = len(after.rstrip())
            if end > len(before):
                spans.append((len(before), end))
        return Rendered(text, tuple(spans))

    def _render_marked(self, messages: Sequence[dict], where: str) -> Rendered:
        """The text between the marks, and the marked spans (a nested block counts as its outermost one)."""
        raw = self._render(messages, False, where)
        if _OPEN not in raw:
            return Rendered(raw, ())
        text, spans, length, depth, start = [], [], 0, 0, 0
        for part in re.split(f"([{_OPEN}{_CLOSE}])", raw):
            if part == _OPEN:
                depth += 1
                start = length if depth == 1 else start
            elif part == _CLOSE:
                depth -= 1
                if depth == 0 and length > start:
                    spans.append((start, length))
            elif part:
                text.append(part)
                length += len(part)
        return Rendered("".join(text), tuple(spans))


def _chatml(messages: Sequence[dict], where: str) -> Rendered:
    """CHATML_MARKED in Python."""
    parts, spans, length = [], [], 0
    for message in messages:
        head = "<|im_start|>" + message["role"] + "\n"
        body = message["content"] + "<|im_end|>"
        if message["role"] == "assistant" and body:
            spans.append((length + len(head), length + len(head) + len(body)))
        parts += (head, body, "\n")
        length += len(head) + len(body) + 1
    return Rendered("".join(parts), tuple(spans))


def _gemma(messages: Sequence[dict], where: str) -> Rendered:
    """GEMMA_MARKED in Python (bos_token <bos>; Jinja's `trim` is str.strip)."""
    prefix, turns = "", list(messages)
    if turns and turns[0]["role"] == "system":
        prefix, turns = turns[0]["content"] + "\n\n", turns[1:]
    parts, spans, length = ["<bos>"], [], len("<bos>")
    for index, message in enumerate(turns):
        if (message["role"] == "user") != (index % 2 == 0):
            raise DataError(f"{where}: chat template gemma refused the conversation: Conversation roles must "
                            "alternate user/assistant/user/assistant/...")
        role = "model" if message["role"] == "assistant" else message["role"]
        head = "<start_of_turn>" + role + "\n" + (prefix if index == 0 else "")
        body = message["content"].strip() + "<end_of_turn>"
        if role == "model":
            spans.append((length + len(head), length + len(head) + len(body)))
        parts += (head, body, "\n")
        length += len(head) + len(body) + 1
    return Rendered("".join(parts), tuple(spans))


DIRECT = {"chatml": _chatml, "gemma": _gemma}


def load_template(spec: str, flag: str = "--chat_template") -> ChatTemplate:
    """A built-in name (chatml, gemma), a tokenizer_config.json (or a folder holding one), or a .jinja file."""
    spec = spec.strip()
    if spec in BUILTINS:
        b = BUILTINS[spec]
        template = ChatTemplate(b.source, name=spec, special_tokens=b.special_tokens, end_of_turn=b.end_of_turn,
                                bos_token=b.bos_token, eos_token=b.eos_token)
        template.direct = DIRECT[spec]
        return template
    path = spec
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {spec}: no such file; give {' or '.join(BUILTINS)}, a tokenizer_config.json (or its "
                          "folder), or a .jinja file")
    with open(path, encoding="utf-8") as handle:
        content = handle.read()
    if not path.endswith(".json"):
        return ChatTemplate(content, name=os.path.basename(path))
    return _from_tokenizer_config(path, content, flag)


def _from_tokenizer_config(path: str, content: str, flag: str) -> ChatTemplate:
    try:
        config = json.loads(content)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{flag} {path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    source = config.get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        named = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{flag} {path}: has no chat_template; give a built-in ({', '.join(BUILTINS)}) or a .jinja file")
    added = config.get("added_tokens_decoder") or {}
    special_ids = {entry["content"]: int(i) for i, entry in added.items()
                   if isinstance(entry, dict) and entry.get("special") and isinstance(entry.get("content"), str)}
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    # The special tokens this template uses: those it writes itself, and bos/eos where it writes those.
    used = [token for token in special_ids if token in source]
    used += [token for token, var in ((bos, "bos_token"), (eos, "eos_token")) if token and var in source]
    end_of_turn = eos if eos and (eos in source or "eos_token" in source) else ""
    return ChatTemplate(source, name=path, special_tokens=used, end_of_turn=end_of_turn, bos_token=bos,
                        eos_token=eos, special_ids={t: special_ids[t] for t in used if t in special_ids})
