"""Our tf.data functions are traced as written, as TensorFlow's and Keras's own are; a user's are converted.

Autograph rewrites a function's Python source, and every call inside a converted function goes through
its `converted_call`, each time a dataset function is traced. A pipeline is traced anew for every input
pipeline, epoch, resume and restart, and ours is deep (packing, chunking, mixtures), so that cost came
back again and again: a packed mixture's build spent a third of its time in autograph (cProfile of
`test_mixture_reweight`, 66 s -> 45 s with ours left alone). Our functions need none of it: where a
tensor decides, they use `tf.cond`, `tf.while_loop` or a tf.data op.

So `tpu_pipeline.pipeline` and `tpu_pipeline.ops` join the modules autograph never converts (TensorFlow
keeps that list for itself, Keras and NumPy; its own tests extend it the same way). A user's function
that our code calls (a registered op, `keyed`'s tensor function, a `MapFeatures` op or parse given in
Python) goes through `users_code`, which converts it as any tf.data map would: an `if` on a tensor in it
works as before. A user's own stage or source is called while the pipeline is built, outside any
function of ours that tf.data traces, so the maps it makes convert by themselves.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import tensorflow as tf
from tensorflow.python.autograph.core import config as _autograph_config  # no public API for this list

OURS = ("tpu_pipeline.pipeline", "tpu_pipeline.ops")
Fn = TypeVar("Fn", bound=Callable)


def trace_ours_as_written() -> None:
    """Adds our packages to autograph's do-not-convert rules, once."""
    present = {str(rule) for rule in _autograph_config.CONVERSION_RULES}
    added = tuple(rule for rule in map(_autograph_config.DoNotConvert, OURS) if str(rule) not in present)
    _autograph_config.CONVERSION_RULES = added + tuple(_autograph_config.CONVERSION_RULES)


def is_ours(fn: Callable) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return any(module == package or module.startswith(package + ".") for package in OURS)


def users_code(fn: Fn) -> Fn:
    """`fn` converted by autograph when it is a user's, wherever in our (unconverted) code it is called.

    The wrapper is converted explicitly (`tf.autograph.to_graph`) and calls `fn` through autograph's
    `converted_call`, which converts it, or, where it cannot, warns and runs it as written (what
    `dataset.map` does with a function it cannot convert)."""
    if is_ours(fn):
        return fn

    def call_users_code(*args, **kwargs):
        return fn(*args, **kwargs)

    return tf.autograph.to_graph(call_users_code)


trace_ours_as_written()
