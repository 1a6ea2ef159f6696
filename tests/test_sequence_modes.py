"""Each sequence mode is one object (tpu_pipeline.pipeline.sequences.modes) that owns its decisions: nothing
outside it compares mode names, and the modes listed there are exactly the names a config accepts."""
from __future__ import annotations

import pathlib
import re
import typing

import pytest

from tpu_pipeline.config.sequence import SequenceConfig
from tpu_pipeline.pipeline.sequences.modes.registry import MODES, sequence_mode

pytestmark = pytest.mark.tf_independent

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tpu_pipeline"
# A comparison with a mode's name: `== "pack"`, `!= 'bucket'`, `in ("pad", ...)`.
COMPARED = re.compile(r"""(==|!=)\s*["'](pad|bucket|pack)["']|\bin\s*[(\[{]\s*["'](pad|bucket|pack)["']""")
# The config layer validates a config without TensorFlow, so it checks each mode's own keys by name.
OWNERS = ("pipeline/sequences/modes/", "config/")


def test_no_module_outside_the_modes_compares_mode_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(OWNERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARED.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "ask the mode object (pipeline.sequence_mode) instead:\n" + "\n".join(found)


def test_the_modes_are_the_names_a_config_accepts():
    accepted = set(typing.get_args(SequenceConfig.model_fields["mode"].annotation))
    assert set(MODES) == accepted
    assert all(sequence_mode(name).name == name == str(sequence_mode(name)) for name in MODES)


def test_the_planted_comparison_is_found(tmp_path):
    assert COMPARED.search('    if sequence.mode == "pack":') and COMPARED.search("if mode in ('pad', 'bucket'):")
    assert not COMPARED.search('    fix = "truncate (or split)" if splits else "truncate"')


def test_a_pipeline_built_by_hand_takes_its_mode_from_its_windowed_stage():
    """Without a plan (stages composed in Python), bucketing still shares the stream across hosts and
    evaluates by counted batches: the mode comes from the stage that places windows."""
    import numpy as np

    from tpu_pipeline.pipeline import ArraySource, Pipeline
    from tpu_pipeline.pipeline.sequences.sequence_stages import Bucket, PackRows

    source = ArraySource({"x": np.arange(4)})
    bucket = Bucket(["tokens"], 8, lengths={"tokens": 8}, bucket_lengths=(4, 8), global_batch_size=4)
    assert Pipeline(source, [bucket]).sequence_mode is sequence_mode("bucket")
    assert Pipeline(source, [PackRows(["tokens"], 8, lengths={"tokens": 8})]).sequence_mode is sequence_mode("pack")
    assert Pipeline(source, []).sequence_mode is None
