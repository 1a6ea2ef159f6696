"""A consumer of the tf.data service in its own process, as a trainer host is.

    python service_child.py CONFIG_JSON [HOST NUM_HOSTS]

CONFIG_JSON is a `data` section (with data.service.address); HOST of NUM_HOSTS makes this process
one of several trainer hosts (its input pipeline id). $SERVICE_CHILD_DELAY: seconds to wait after
each batch (a slow trainer, so that workers hold data). Prints one JSON line per batch,
{"ids": [...], "marks": [...]}, where a mark is a number that a horizontal flip of the example's
image changes (so two copies of one example show whether they were augmented alike); "END" at the
end of the stream.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402


def main() -> None:
    config = config_from_dict({"data": json.loads(sys.argv[1])}).data
    context = None
    if len(sys.argv) > 2:
        host, hosts = int(sys.argv[2]), int(sys.argv[3])
        context = tf.distribute.InputContext(num_input_pipelines=hosts, input_pipeline_id=host, num_replicas_in_sync=hosts)
    for batch in Pipeline.from_config(config).build(context):
        line = {"ids": batch["id"].numpy().tolist()}
        if "image" in batch:
            image = tf.cast(batch["image"], tf.float32)
            columns = tf.cast(tf.range(tf.shape(image)[2]), tf.float32)[None, None, :, None]
            line["marks"] = tf.reduce_sum(image * columns, axis=[1, 2, 3]).numpy().round(2).tolist()
        print(json.dumps(line), flush=True)
        time.sleep(float(os.environ.get("SERVICE_CHILD_DELAY", "0")))
    print("END", flush=True)


if __name__ == "__main__":
    main()
