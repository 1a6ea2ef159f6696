"""A consumer of the tf.data service in its own process, as a trainer host is.

    python service_child.py CONFIG_JSON

CONFIG_JSON is a `data` section (with data.service.address). Prints one JSON line per batch,
{"ids": [...], "marks": [...]}, where a mark is a number that a horizontal flip of the example's
image changes (so two copies of one example show whether they were augmented alike); "END" at the
end of the stream.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402


def main() -> None:
    config = config_from_dict({"data": json.loads(sys.argv[1])}).data
    for batch in Pipeline.from_config(config).build():
        line = {"ids": batch["id"].numpy().tolist()}
        if "image" in batch:
            image = tf.cast(batch["image"], tf.float32)
            columns = tf.cast(tf.range(tf.shape(image)[2]), tf.float32)[None, None, :, None]
            line["marks"] = tf.reduce_sum(image * columns, axis=[1, 2, 3]).numpy().round(2).tolist()
        print(json.dumps(line), flush=True)
    print("END", flush=True)


if __name__ == "__main__":
    main()
