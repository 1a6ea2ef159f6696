"""The whole config: one strict section per layer, and the defaults one section takes from another."""
from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.config.data import DataConfig, derived_outputs
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.config.tasks import check_one_vocabulary
from tpu_pipeline.config.train import TrainConfig

# eval_data.sequence keys that follow data.sequence unless set: the ones that decide the shapes the model
# sees, and (in the same mode) how examples become rows.
_FOLLOWED = ("keys", "length", "mode")


def follow_train_sequence(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with eval_data.sequence taking data.sequence's keys, length and mode where it sets none (and,
    when the two modes agree, its other keys too), so that changing data.sequence.length alone changes
    both: an evaluation must feed the model the shapes it was built for. No eval_data.sequence at all
    takes data.sequence whole; `eval_data.sequence: null` keeps evaluation without one, and a followed key
    set to null follows too (`eval_data.sequence.length=null` on the command line)."""
    train, evaluation = raw.get("data"), raw.get("eval_data")
    if not isinstance(train, Mapping) or not isinstance(evaluation, Mapping):
        return dict(raw)
    given = train.get("sequence")
    if not isinstance(given, Mapping):
        return dict(raw)
    own = evaluation.get("sequence", {}) if "sequence" in evaluation else {}
    if not isinstance(own, Mapping):  # null (no sequence) or a wrong type, which validation names
        return dict(raw)
    own = {k: v for k, v in own.items() if not (k in _FOLLOWED and v is None)}  # `length: null`: follow too
    followed = {key: copy.deepcopy(given[key]) for key in _FOLLOWED if key in given and key not in own}
    merged = {**followed, **own}
    if merged.get("mode", "pack") == given.get("mode", "pack"):
        merged = {**{k: copy.deepcopy(v) for k, v in given.items() if k not in _FOLLOWED}, **merged}
    return {**raw, "eval_data": {**evaluation, "sequence": merged}}


def unset_followed(raw: Mapping[str, Any], config: "Config") -> None:
    """Marks what eval_data took from data.sequence as not set by the user, so `tpu-pipeline config
    --set_only` leaves it out and a config taken back still follows data.sequence."""
    evaluation = raw.get("eval_data")
    if config.eval_data is None or config.eval_data.sequence is None or not isinstance(evaluation, Mapping):
        return
    own = evaluation.get("sequence")
    if "sequence" not in evaluation:
        config.eval_data.__pydantic_fields_set__.discard("sequence")
    own_keys = {k for k, v in own.items() if v is not None} if isinstance(own, Mapping) else set()
    config.eval_data.sequence.__pydantic_fields_set__.intersection_update(own_keys)


class Config(StrictModel):
    """Top level of a YAML config file. Every section is optional; each layer reads its own."""

    imports: list[str] = []
    data: Optional[DataConfig] = None
    eval_data: Optional[DataConfig] = None
    cluster: ClusterConfig = ClusterConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()

    @pydantic.model_validator(mode="after")
    def _one_vocabulary(self) -> "Config":
        """A language model's train.num_classes and model.transformer.vocab_size, when both set, agree."""
        check_one_vocabulary(self.train.task, self.train.num_classes, self.model.transformer.vocab_size)
        return self

    @pydantic.model_validator(mode="after")
    def _derived_outputs(self) -> "Config":
        """data.outputs and eval_data.outputs a language model needs, from data.sequence and train.task,
        where the config gives none (an explicit value, null included, is kept)."""
        for name in ("data", "eval_data"):
            section = getattr(self, name)
            if section is None or "outputs" in section.model_fields_set:
                continue
            outputs = derived_outputs(section.sequence, self.train.task)
            if outputs is not None:
                # A copy, so a DataConfig built in Python and passed in is not changed under its owner;
                # set through __dict__ because assigning on self would validate the whole Config again.
                derived = section.model_copy(update={"outputs": outputs})
                derived.__pydantic_fields_set__.discard("outputs")  # still derived: `config --set_only` leaves it out
                self.__dict__[name] = derived
        return self
