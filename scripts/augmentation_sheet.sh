#!/usr/bin/env bash
# The contact sheet docs/images.md shows: configs/imagenet_vit.yaml (the DeiT recipe) as it trains, on the two
# photographs scikit-learn ships, written as imagenet_to_gcs-style records (image/encoded, image/class/label).
#   bash scripts/augmentation_sheet.sh [OUT.jpg]      (default docs/images/imagenet_vit_sheet.jpg)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/images/imagenet_vit_sheet.jpg}"
DATA="$(mktemp -d)"
trap 'rm -rf "$DATA"' EXIT
.venv/bin/python - "$DATA" <<'PY'
import io, sys
from PIL import Image
from sklearn.datasets import load_sample_images
from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split
import tensorflow as tf

def records():
    for label, photo in enumerate(load_sample_images().images):  # 0: a temple in China, 1: a flower
        jpeg = io.BytesIO()
        Image.fromarray(photo).save(jpeg, format="JPEG", quality=92)
        feature = {"image/encoded": bytes_feature(jpeg.getvalue()), "image/class/label": int_feature(label)}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

write_split(records(), sys.argv[1], "train", 1)
PY
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/tpu-pipeline demo --config configs/imagenet_vit.yaml --show 16 --show_path "$OUT" \
  "data.source.files=$DATA/train-*" data.batch_size=16 data.shuffle.buffer_size=2
