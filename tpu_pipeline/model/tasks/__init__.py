"""The task objects by name: `task_named("language_model")`, and `register` for a new one.

Each task is one module holding one `Task` subclass; this registry holds one instance per name of
`config.tasks.TASKS` (tests/test_tasks.py checks that the two agree). A new task is a new module
whose class is registered here (or, from Python, passed to `build_model(task=...)` as an object).
"""
from __future__ import annotations

from typing import Union

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.tasks.base import Task
from tpu_pipeline.model.tasks.classification import Classification
from tpu_pipeline.model.tasks.language_model import LanguageModel

_REGISTRY: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Makes `task` known by its name (a later one of the same name replaces it)."""
    _REGISTRY[task.name] = task
    return task


def registered() -> tuple[str, ...]:
    """The names of the registered tasks, in registration order."""
    return tuple(_REGISTRY)


def task_named(task: Union[str, Task]) -> Task:
    """The task object for a `train.task` name (a Task is returned as it is); a ConfigError naming the
    tasks there are for an unknown name."""
    if isinstance(task, Task):
        return task
    if task not in _REGISTRY:
        raise ConfigError(f"train.task: {task!r} is not one of {', '.join(_REGISTRY)}")
    return _REGISTRY[task]


register(Classification())
register(LanguageModel())

__all__ = ["Classification", "LanguageModel", "Task", "register", "registered", "task_named"]
