"""The seed tree: every random choice of a pipeline derives from one root, `data.seed`, here.

    data.seed ─┬─ "files"                      file order of epoch e (the same on every input pipeline,
               │                                so file shards never overlap)
               ├─ "shuffle",        pipeline i  record shuffle of epoch e
               ├─ "window_shuffle", pipeline i  window w of epoch e
               ├─ "augment",        pipeline i  the n-th element this pipeline sends through the ops
               ├─ "augment_batch",  pipeline i  the n-th batch this pipeline sends through the batch-level
               │                                ops (mixup, CutMix)
               ├─ "row_shuffle",    pipeline i  the packed rows of the pool that starts at (example, chunk)
               └─ "mix"                        which source each block of a mixture's positions draws from
                                                (the same on every input pipeline)

A node is a stateless `int64[2]` key (a hash of root, purpose and pipeline); an epoch, a window
or an element position is folded into it with `stateless_fold_in`. So "the file order of epoch e"
or "the augmentation seed of element n" is a pure function of a few integers: a resumed run can
recompute any of them, and no seed depends on thread timing or on TF's global random state.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator, Optional, Union

import tensorflow as tf

FILES, SHUFFLE, WINDOW_SHUFFLE, AUGMENT, AUGMENT_BATCH, ROW_SHUFFLE, MIX = (
    "files", "shuffle", "window_shuffle", "augment", "augment_batch", "row_shuffle", "mix")
_PURPOSES = (FILES, SHUFFLE, WINDOW_SHUFFLE, AUGMENT, AUGMENT_BATCH, ROW_SHUFFLE, MIX)

IntLike = Union[int, tf.Tensor]


def node(root: int, purpose: str, pipeline: Optional[int] = None) -> tuple[int, int]:
    """The key of one branch of the tree: (root, purpose[, input pipeline]) hashed to two int63s."""
    if purpose not in _PURPOSES:
        raise ValueError(f"unknown seed purpose {purpose!r}; one of {_PURPOSES}")
    digest = hashlib.blake2b(f"{int(root)}/{purpose}/{'' if pipeline is None else int(pipeline)}".encode(),
                             digest_size=16).digest()
    mask = (1 << 63) - 1
    return int.from_bytes(digest[:8], "little") & mask, int.from_bytes(digest[8:], "little") & mask


def key(root: int, purpose: str, pipeline: Optional[int] = None, *folds: Optional[IntLike]) -> tf.Tensor:
    """The `int64[2]` stateless seed of `node(root, purpose, pipeline)` with each fold (an epoch,
    a window or element index; None skips it) folded in, in order."""
    seed = tf.constant(node(root, purpose, pipeline), tf.int64)
    for fold in folds:
        if fold is not None:
            seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(fold, tf.int64))
    return seed


def positions(start: int = 0) -> tf.data.Dataset:
    """start, start+1, ... as a dataset, to zip with elements (a resumed pipeline starts where it
    stopped). (`Dataset.counter()` and `enumerate()` run a `scan` function per element, ~60 µs on
    one thread here; a range costs next to nothing.)"""
    return tf.data.Dataset.range(start, 1 << 62)


def element_seed(root: int, purpose: str, pipeline: Optional[int], position: tf.Tensor,
                 salt: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The `int64[2]` seed of the `position`-th element: (the node's first half, position).

    Per element, so it is one `stack`: a stateless op hashes its whole seed pair into its key, so
    pairing a fixed half with the position gives an independent stream per element. A `salt`
    (`runtime_salt`) is xor-ed into the first half.
    """
    half = tf.constant(node(root, purpose, pipeline)[0], tf.int64)
    if salt is not None:
        half = tf.bitwise.bitwise_xor(half, salt)
    return tf.stack([half, tf.cast(position, tf.int64)])


def runtime_salt() -> tf.Tensor:
    """An int64 that differs on every machine and run that evaluates it: the clock's bits.

    For the one place where equal seeds are wrong: tf.data service workers run the same graph, so
    with the tree alone every worker would augment its n-th element alike (and, in parallel_epochs
    mode, read the same file order). Evaluated inside a dataset function, it is drawn on the worker.
    """
    return tf.bitcast(tf.timestamp(), tf.int64)


def numbered_and_salted(dataset: tf.data.Dataset, start: int = 0) -> tf.data.Dataset:
    """(element, position, salt) for each element: positions from `start`, and one `runtime_salt()`
    drawn at the first element where the graph runs.

    A `scan` over the dataset, not a zip with `positions()`: on tf.data service workers in
    distributed_epoch mode every source dataset of the graph is split by the dispatcher, so a zipped
    range would cost one dispatcher call per element, and a zipped one-element salt dataset would
    be empty on all workers but one (its endless repeat then spun a core at 100%).
    """
    def number(state, element):
        position, salt = state
        salt = tf.where(tf.equal(salt, 0), runtime_salt(), salt)
        return (position + 1, salt), (element, position, salt)

    return dataset.scan((tf.constant(start, tf.int64), tf.constant(0, tf.int64)), number)


def scalar(seed: tf.Tensor) -> tf.Tensor:
    """One int64 drawn from a whole key, for ops that take a single seed (Dataset.shuffle). (A key's
    halves are not interchangeable: `stateless_fold_in` puts the folded value itself in the second.)"""
    return tf.random.stateless_uniform([], seed=seed, minval=None, maxval=None, dtype=tf.int64)


def file_order(num_files: int, root: int, epoch: IntLike) -> tf.Tensor:
    """The permutation of the (sorted) file list that epoch `epoch` reads, on every input pipeline."""
    return tf.random.experimental.stateless_shuffle(tf.range(num_files, dtype=tf.int64), seed=key(root, FILES, None, epoch))


@contextlib.contextmanager
def without_global_seed() -> Iterator[None]:
    """Builds stateful random ops (Dataset.shuffle) that ignore TF's global seed.

    tf.data pairs an op's seed with the global one (`tf.random.set_seed`, which train.seed sets),
    so without this the data order would change with the model's seed; and a global seed of 0
    with a tensor op seed fails inside a traced function. Inside a function (where a Pipeline
    builds its epochs) the graph's seed is cleared while the op is made; eager ops keep TF's rule.
    """
    if tf.executing_eagerly():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    saved, graph.seed = graph.seed, None
    try:
        yield
    finally:
        graph.seed = saved
