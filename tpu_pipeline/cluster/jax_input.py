"""How a host's batches reach Keras 3's JAX trainer: read-only numpy views, not copies.

Keras's own `TFDatasetAdapter` turns each tf tensor into numpy with `np.array`: a copy, and a writable
one, which JAX's CPU client copies once more into the devices (it aliases only read-only arrays).
`np.asarray` of an eager tensor is a read-only view of its buffer (the view keeps the tensor alive), so
`jax.make_array_from_process_local_data` can take it as it is: on this CPU the hand-off of a 12 MiB
image batch through Keras's trainer fell from 2.3 ms (its adapter) to 0.36 ms (this one;
benchmarks/bench_jax_input.py). On a TPU the host-to-device copy happens anyway; the `np.array` copy is
what is saved.

`host_batches` wraps one process's `tf.data.Dataset` of process batches in a Keras `DataAdapter` that
`fit` and `evaluate` take as it is (`get_data_adapter` returns a given adapter unchanged). Each pass
iterates the dataset from its start, as Keras's own adapter does: no batch is peeked and re-yielded
(Keras's generator adapter would, which would break an exact resume of the input position).

Imported only on the JAX path (it imports Keras 3).
"""
from __future__ import annotations

import functools
from typing import Any, Iterator

import numpy as np
import tensorflow as tf


def host_batches(dataset: tf.data.Dataset) -> Any:
    """`dataset` (this process's batches, already its shard: no `distribute_dataset` after the fact)
    as the adapter Keras's JAX trainer pulls read-only numpy views from."""
    return _adapter_class()(dataset)


@functools.cache
def _adapter_class() -> type:
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    class HostBatches(TFDatasetAdapter):
        """This process's batches for Keras 3 on JAX; iterating it yields the tf elements, as a
        `tf.distribute` strategy's distributed dataset does."""

        def __init__(self, dataset: tf.data.Dataset) -> None:
            super().__init__(dataset)  # no distribution: the input is per host already
            self.dataset = dataset

        @property
        def element_spec(self) -> Any:
            return self.dataset.element_spec

        def __iter__(self) -> Iterator[Any]:
            return iter(self.dataset)

        def get_jax_iterator(self) -> Iterator[Any]:
            for batch in self.dataset:
                yield tf.nest.map_structure(_view, batch)

        def get_numpy_iterator(self) -> Iterator[Any]:
            return self.get_jax_iterator()

    return HostBatches


def _view(tensor: Any) -> Any:
    """A dense tensor as a read-only numpy view of its buffer; anything else as Keras converts it."""
    if isinstance(tensor, tf.Tensor):
        return np.asarray(tensor)
    from keras.src.backend.tensorflow.core import convert_to_numpy
    return convert_to_numpy(tensor)
