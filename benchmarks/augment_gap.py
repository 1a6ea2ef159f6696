"""What augmentation does to the gap between training and validation accuracy, on real images a package ships.

    .venv/bin/python benchmarks/augment_gap.py --epochs 200 --seeds 0,1

The data: scikit-learn's handwritten digits (1,797 scans of 8 x 8 pixels, 10 classes), scaled to 32 x 32 RGB
and written as PNG records, 400 for training and 1,397 for validation (a seeded, stratified split: few training
images, so that a model can learn them by heart). The same small CNN (`model.cnn`) is trained by
`tpu_pipeline.train.train` with the same steps, once without augmentation and once with RandAugment(1, 5),
random erasing 0.25 and mixup 0.2 (label smoothing 0.1). Then each
model's accuracy is measured on the clean training images and on the validation images (no augmentation in
either): the gap between the two is what the augmentation is for. (Flips are left out: a flipped 2 is no digit.)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split  # noqa: E402

SIZE, TRAIN = 32, 400
# RandAugment's shifts and Cutout are in pixels of a 224 image (translate_const 100, cutout_const 40): scaled here
# to 32 (14 and 6). Invert, Solarize and Equalize turn a digit into another picture of it, so they stay.
# CutMix is left out: a third of a 32-pixel digit pasted over another leaves neither (docs/images.md shows a sheet).
# The images are normalized by the training set's mean and deviation (as ImageNet's are), so that erasing's
# N(0, 1) noise is on the images' own scale.
AUGMENT = [{"op": "randaugment", "num_layers": 1, "magnitude": 5, "translate_const": 14, "cutout_const": 6},
           "NORMALIZE",
           {"op": "random_erasing", "probability": 0.25},
           {"op": "mixup_cutmix", "num_classes": 10, "mixup_alpha": 0.2, "cutmix_alpha": 0.0, "label_smoothing": 0.1}]


def digits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (uint8 images [n, 32, 32, 3], labels [n])}: the digits scaled up, a stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = tf.image.resize(data.images[..., None] * (255.0 / 16.0), [SIZE, SIZE], method="bilinear").numpy()
    images = np.repeat(np.clip(images, 0, 255).astype(np.uint8), 3, axis=-1)
    train_x, valid_x, train_y, valid_y = train_test_split(images, data.target, train_size=TRAIN, random_state=seed,
                                                          stratify=data.target)
    return {"train": (train_x, train_y), "validation": (valid_x, valid_y)}


def write(splits: dict[str, tuple[np.ndarray, np.ndarray]], directory: str) -> None:
    for split, (images, labels) in splits.items():
        def records(images=images, labels=labels):
            for image, label in zip(images, labels):
                feature = {"image": bytes_feature(tf.io.encode_png(image).numpy()), "label": int_feature(int(label))}
                yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        write_split(records(), directory, split, 2)


def normalize(images: np.ndarray) -> dict:
    """The `normalize` op with the training images' mean and standard deviation (0..255)."""
    return {"op": "normalize", "mean": float(images.mean()), "std": float(images.std())}


def config(directory: str, run_dir: str, augmented: bool, epochs: int, seed: int, scale: dict) -> dict:
    def data(split: str, training: bool) -> dict:
        preprocess = [{"op": "decode_image", "format": "png", "channels": 3},
                      {"op": "resize", "size": SIZE},  # the static shape a model needs (the images are 32 x 32)
                      {"op": "cast", "key": "label", "dtype": "int32"}]
        augment = [scale if op == "NORMALIZE" else op for op in AUGMENT] if augmented and training else []
        if not augment:
            preprocess.append(scale)
        return {"source": {"type": "tfrecord", "files": os.path.join(directory, f"{split}-*")},
                "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}},
                "preprocess": preprocess, "augment": augment, "cache": {"enabled": True},
                "shuffle": {"buffer_size": 1000} if training else {"enabled": False},
                "repeat": "forever" if training else 1, "batch_size": 50, "seed": seed,
                "outputs": {"inputs": "image", "targets": "label"}}

    return {"data": data("train", True), "eval_data": data("validation", False),
            "model": {"architecture": "cnn", "cnn": {"filters": [32, 64], "dropout": 0.0},
                      "optimizer": {"name": "adam"},
                      "schedule": {"name": "cosine", "learning_rate": 0.003, "warmup_epochs": 1}},
            "train": {"run_dir": run_dir, "epochs": epochs, "steps_per_epoch": TRAIN // 50, "num_classes": 10,
                      "tensorboard": False, "seed": seed, "log_every_steps": 1000}}


def accuracy(model, images: np.ndarray, labels: np.ndarray, scale: dict) -> float:
    logits = model.predict((images.astype(np.float32) - scale["mean"]) / scale["std"], batch_size=200, verbose=0)
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--seeds", default="0,1")
    args = parser.parse_args()
    from tpu_pipeline.train import load_model, train

    rows = {False: [], True: []}
    for seed in (int(s) for s in args.seeds.split(",")):
        splits = digits(seed)
        with tempfile.TemporaryDirectory() as directory:
            write(splits, directory)
            for augmented in (False, True):
                scale = normalize(splits["train"][0])
                raw = config(directory, os.path.join(directory, f"run_{augmented}"), augmented, args.epochs, seed, scale)
                train(config_from_dict(raw), printer=lambda line: None)
                model = load_model(config_from_dict(raw))
                figures = tuple(accuracy(model, *splits[split], scale) for split in ("train", "validation"))
                rows[augmented].append(figures)
                print(f"seed {seed} {'augmented' if augmented else 'plain':9s}: training accuracy {figures[0]:.4f}, "
                      f"validation {figures[1]:.4f}, gap {figures[0] - figures[1]:.4f}", flush=True)
    print(f"\ndigits 32 x 32, {TRAIN} training / {1797 - TRAIN} validation images, {args.epochs} epochs of "
          f"{TRAIN // 50} steps, median over seeds:")
    for augmented, figures in rows.items():
        train_acc = statistics.median(f[0] for f in figures)
        valid_acc = statistics.median(f[1] for f in figures)
        gap = statistics.median(f[0] - f[1] for f in figures)
        print(f"  {'augmented' if augmented else 'plain':9s} training {train_acc:.4f}  validation {valid_acc:.4f}  "
              f"gap {gap:.4f}")


if __name__ == "__main__":
    main()
