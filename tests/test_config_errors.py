"""A config value of the wrong type or range is one line in the config's words: the key as typed, the
value given, and every form the key accepts (a union's members together, never pydantic's tags)."""
from __future__ import annotations

import os

import pytest

from tpu_pipeline.config import load_config
from tpu_pipeline.errors import ConfigError

pytestmark = pytest.mark.tf_independent

TEXT_LM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "text_lm.yaml")
PYDANTIC_WORDS = ("constrained-", "literal[", "dict[str", "list[str]", "Input should", "Value error", "function-")


def error_of(*overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(TEXT_LM, list(overrides))
    return str(raised.value)


@pytest.mark.parametrize("override, expected", [
    ("data.sequence.length=-5", "data.sequence.length=-5: must be a positive integer or {key: positive integer}"),
    ("data.repeat=0", "data.repeat=0: must be a positive integer or 'forever'"),
    ("data.repeat=abc", "data.repeat='abc': must be a positive integer or 'forever'"),
    ("data.batch_size=many", "data.batch_size='many': must be a positive integer"),
    ("data.source.compression=BZ2", "data.source.compression='BZ2': must be '', 'GZIP' or 'ZLIB'"),
    ("data.max_skipped=1.5", "data.max_skipped=1.5: must be a non-negative integer or a number of at least 0 and below 1"),
    ("data.outputs.inputs=[1]", "data.outputs.inputs=[1]: must be a string or a list of strings"),
    ("data.cache.records=maybe", "data.cache.records='maybe': must be 'auto', true or false"),
    ("data.sequence.window=0", "data.sequence.window=0: must be a positive integer or 'auto'"),
    ("train.profile_steps=[1]", "train.profile_steps=[1]: must be a list of 2 positive integers"),
    ("train.checkpoint_every_seconds=-1", "train.checkpoint_every_seconds=-1: must be a positive number, 'auto' or null"),
    ("cluster.cpu_replicas=0", "cluster.cpu_replicas=0: must be an integer of at least 1"),
    ("data.shuffle=3", "data.shuffle=3: must be a mapping of its keys (enabled, buffer_size, mode, reshuffle_each_iteration)"),
])
def test_a_wrong_value_is_one_line_naming_the_key_the_value_and_what_it_takes(override, expected):
    message = error_of(override)
    assert message == expected
    assert not any(word in message for word in PYDANTIC_WORDS), message


def test_a_dict_length_with_a_bad_entry_is_one_line_for_the_whole_key():
    message = error_of("data.sequence.length={inputs: 0, targets: 256}")
    assert message == ("data.sequence.length={'inputs': 0, 'targets': 256}: must be a positive integer or "
                       "{key: positive integer}")


def test_several_problems_are_one_line_each_under_one_heading():
    message = error_of("data.batch_size=-1", "data.repeat=0")
    assert message.splitlines() == ["invalid config:", "  data.repeat=0: must be a positive integer or 'forever'",
                                    "  data.batch_size=-1: must be a positive integer"]


def test_our_own_validator_messages_keep_their_words_without_pydantic_prefixes():
    message = error_of("data.features.tokens.shape=[3]")
    assert message.startswith("data.features.tokens: kind ragged is one 1-D vector of any length per example"), message
    assert "\n" not in message and "Value error" not in message
