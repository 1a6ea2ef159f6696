"""DeiT-style augmentation on W1's records: our pipeline against tensorflow/models' own, side by side in one run.

    python benchmarks/bench_augment.py --rounds 3 --seconds 4

Both do, per example, an inception crop of the JPEG to 224, a flip, RandAugment(2, 9), normalize and random erasing
0.25, then mixup 0.8 / CutMix 1.0 (switch 0.5, label smoothing 0.1) on each batch of 128, and give bfloat16 images
(TFM casts each example before the mix, as its Parser does; ours casts the mixed batch, as configs/imagenet_vit.yaml):

  ours          Pipeline.from_config: the ops named in its config (`randaugment`, `random_erasing`, `mixup_cutmix`)
  TFM           official.core.input_reader.InputReader with official.vision.dataloaders.classification_input's
                Parser (its RandAugment and RandomErasing from augment.py) and augment.MixupAndCutmix as the
                reader's postprocess_fn, as tensorflow/models' image classification task builds it
  ours_w1       our W1 pipeline without augmentation (crop, flip, cast: benchmarks/bench_pipelines.py's W1)

and the augmentation alone (`ops ours`, `ops TFM`): RandAugment, normalize, erasing and the batch mix on 224 x 224
crops already decoded into memory, so that what the augmentation costs can be told from what the rest costs.
The figure per pipeline is examples per second per core (1 / CPU seconds per example: this 2-core machine is
shared, so CPU time is the steadier measure); ratios are taken within a round. Needs tf-models-official and
gin-config (bash benchmarks/setup_bench.sh).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))  # TFM, loaded as the tests load it

import tensorflow as tf  # noqa: E402

import workloads  # noqa: E402
from bench_pipelines import timed  # noqa: E402
from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.ops import build_ops  # noqa: E402
from tpu_pipeline.config.data import OpConfig  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402

BATCH, CLASSES = 128, 1000
RANDAUGMENT = {"op": "randaugment", "num_layers": 2, "magnitude": 9}
PER_EXAMPLE = [RANDAUGMENT, {"op": "normalize"}, {"op": "random_erasing", "probability": 0.25}]
TO_BFLOAT16 = {"op": "cast", "dtype": "bfloat16"}  # after the mix, on the batch (as configs/imagenet_vit.yaml)
MIX = {"op": "mixup_cutmix", "num_classes": CLASSES, "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5,
       "label_smoothing": 0.1}


def ours_config(augmented: bool) -> dict:
    config = dict(workloads.workload("w1_images").config)
    crop_flip = config["augment"][:2]
    label = {"op": "cast", "key": "label", "dtype": "int32"}
    config["augment"] = crop_flip + PER_EXAMPLE + [label, MIX, TO_BFLOAT16] if augmented else config["augment"]
    return config


def tfm_modules():
    """tensorflow/models' classification Parser, augment module and InputReader (official.vision's own __init__
    imports every vision task's dependencies, so its packages are entered bare, as the tests enter them)."""
    from augment_reference import enter_bare

    enter_bare(("official.vision", "official.vision.ops", "official.vision.configs", "official.vision.dataloaders"))
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from official.core import config_definitions, input_reader
    from official.vision.configs import common
    from official.vision.dataloaders import classification_input
    from official.vision.ops import augment
    return config_definitions, input_reader, common, classification_input, augment


def tfm_parser_and_mix():
    _, _, common, classification_input, augment = tfm_modules()
    parser = classification_input.Parser(
        output_size=[224, 224], num_classes=CLASSES, image_field_key="image", label_field_key="label",
        aug_type=common.Augmentation(type="randaug", randaug=common.RandAugment(num_layers=2, magnitude=9,
                                                                                translate_const=100)),
        random_erasing=common.RandomErasing(probability=0.25), dtype="bfloat16")
    mix = augment.MixupAndCutmix(num_classes=CLASSES, mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5,
                                 label_smoothing=0.1)
    return parser, mix, augment


def tfm_pipeline(pattern: str) -> tf.data.Dataset:
    config_definitions, input_reader, _, classification_input, _ = tfm_modules()
    parser, mix, _ = tfm_parser_and_mix()
    decoder = classification_input.Decoder(image_field_key="image", label_field_key="label")
    params = config_definitions.DataConfig(input_path=pattern, global_batch_size=BATCH, is_training=True,
                                           drop_remainder=True, shuffle_buffer_size=256, deterministic=False,
                                           cycle_length=None)
    reader = input_reader.InputReader(params, dataset_fn=tf.data.TFRecordDataset, decoder_fn=decoder.decode,
                                      parser_fn=parser.parse_fn(is_training=True), postprocess_fn=mix)
    return reader.read()


def crops(pattern: str, count: int = 256) -> tf.Tensor:
    """float32 [count, 224, 224, 3]: W1's first images, cropped and decoded once (the ops-alone input), as the
    crop op gives them to the ops after it (its resize makes float32)."""
    config = config_from_dict({"data": {**ours_config(False), "shuffle": {"enabled": False}, "repeat": 1,
                                        "outputs": None, "batch_size": count}}).data
    config.augment = config.augment[:2]  # the crop and the flip
    return next(iter(Pipeline.from_config(config).build()))["image"]


def ops_ours(images: tf.Tensor) -> tf.data.Dataset:
    per_example, random = build_ops([OpConfig.model_validate(op) for op in PER_EXAMPLE], "augment")
    (mix, to_bfloat16), _ = build_ops([OpConfig.model_validate(MIX), OpConfig.model_validate(TO_BFLOAT16)], "augment")

    def augment(image, label, index):
        features = {"image": image, "label": label}
        for position, op in enumerate(per_example):
            features = op(features, tf.stack([index, tf.cast(position, tf.int64)]) if random[position] else None)
        return features

    dataset = tf.data.Dataset.from_tensor_slices((images, tf.range(len(images)) % CLASSES)).repeat()
    dataset = tf.data.Dataset.zip((dataset, tf.data.Dataset.range(1 << 62)))
    dataset = dataset.map(lambda pair, index: augment(*pair, index), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = tf.data.Dataset.zip((dataset.batch(BATCH, drop_remainder=True), tf.data.Dataset.range(1 << 62)))
    return dataset.map(lambda batch, index: to_bfloat16(mix(batch, tf.stack([index, tf.constant(7, tf.int64)]))),
                       num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def ops_tfm(images: tf.Tensor) -> tf.data.Dataset:
    parser, mix, augment = tfm_parser_and_mix()

    from official.vision.ops import preprocess_ops

    def per_example(image, label):  # what Parser._parse_train_image does after its crop, flip and resize
        image = parser._augmenter.distort(image)
        image = preprocess_ops.normalize_image(image, offset=preprocess_ops.MEAN_RGB, scale=preprocess_ops.STDDEV_RGB)
        image = parser._random_erasing.distort(image)
        return tf.image.convert_image_dtype(image, tf.bfloat16), label

    dataset = tf.data.Dataset.from_tensor_slices((images, tf.range(len(images)) % CLASSES)).repeat()
    dataset = dataset.map(per_example, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH, drop_remainder=True)
    return dataset.map(mix, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--cache_dir", default=None)
    args = parser.parse_args()
    pattern = workloads.files("w1_images", args.cache_dir)
    images = crops(pattern)
    augmented = config_from_dict({"data": ours_config(True)}).data
    plain = config_from_dict({"data": ours_config(False)}).data
    pipelines: dict[str, Callable[[], tf.data.Dataset]] = {
        "ours": lambda: Pipeline.from_config(augmented).build(),
        "TFM": lambda: tfm_pipeline(pattern),
        "ours_w1": lambda: Pipeline.from_config(plain).build(),
        "ops ours": lambda: ops_ours(images),
        "ops TFM": lambda: ops_tfm(images),
    }
    names = list(pipelines)
    rounds = []
    for index in range(args.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        results = {name: timed(pipelines[name], BATCH, args.seconds, warmup=3) for name in order}
        rounds.append(results)
        print(f"round {index + 1}: " + ", ".join(
            f"{name} {1 / results[name]['cpu_seconds_per_example']:,.0f}/s/core" for name in names), flush=True)

    def per_core(result: dict) -> float:
        return 1 / result["cpu_seconds_per_example"]

    print(f"\nW1 records, batch {BATCH}, {args.rounds} rounds: examples per second per core (CPU ms per example)")
    for name in names:
        rates = [per_core(r[name]) for r in rounds]
        cpu = statistics.median(r[name]["cpu_seconds_per_example"] for r in rounds) * 1e3
        print(f"  {name:10s} median {statistics.median(rates):8,.0f}   worst {min(rates):8,.0f}   ({cpu:.2f} ms)")
    print("\nratios per round (median / worst):")
    for label, top, bottom in (("ours / TFM", "ours", "TFM"), ("ops ours / ops TFM", "ops ours", "ops TFM"),
                               ("ours / ours_w1", "ours", "ours_w1")):
        ratios = [per_core(r[top]) / per_core(r[bottom]) for r in rounds]
        print(f"  {label:22s} {statistics.median(ratios):6.2f} / {min(ratios):6.2f}")
    extra = [(r["ours"]["cpu_seconds_per_example"] - r["ours_w1"]["cpu_seconds_per_example"]) * 1e3 for r in rounds]
    alone = [r["ops ours"]["cpu_seconds_per_example"] * 1e3 for r in rounds]
    print(f"\nwhat augmentation adds to our W1: {statistics.median(extra):.2f} ms of CPU per example; "
          f"the ops alone: {statistics.median(alone):.2f} ms")


if __name__ == "__main__":
    main()
