"""A contact sheet: the first N examples a pipeline delivers, as one PNG, each with its label or soft target.

So a user sees what the augmentation does (RandAugment at magnitude 9, erasing, mixup and CutMix) before
spending accelerator hours on it: `tpu-pipeline demo --config ... --show 16` writes one. Each image is
stretched to its own 0..255 range for display (normalized images, erasing noise), and captioned with its
class id, or a soft target's two largest classes with their weights ("class 3: 62%, class 7: 38%").
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterable

import numpy as np

from tpu_pipeline.errors import ConfigError

CAPTION_HEIGHT = 14
MIN_TILE = 128  # smaller images are enlarged (nearest pixel) to a tile of at least this width: room for the caption


def images_and_labels(element: Any) -> tuple[np.ndarray, np.ndarray]:
    """(images [B, H, W, C], labels [B] or [B, classes]) from a batch: (inputs, targets[, weights]) or a dict
    with one batch of images (rank 4) and one label feature."""
    if isinstance(element, (tuple, list)):
        images, labels = element[0], element[1]
    elif isinstance(element, dict):
        images = [value for value in element.values() if len(getattr(value, "shape", ())) == 4]
        labels = [value for key, value in element.items() if "label" in key]
        if len(images) != 1 or len(labels) != 1:
            raise ConfigError(f"--show: a batch of images and one label feature are needed to draw a contact sheet; "
                              f"the batches hold {sorted(element)}: set data.outputs {{inputs: ..., targets: ...}}")
        images, labels = images[0], labels[0]
    else:
        raise ConfigError(f"--show: the pipeline's batches are {type(element).__name__}, not images with labels")
    images, labels = np.asarray(images, np.float32), np.asarray(labels)
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ConfigError(f"--show: the inputs are {images.shape}, not a batch of images [batch, height, width, 1 or 3]")
    return images, labels


def caption(label: np.ndarray) -> str:
    """'class 3', or a soft target's two largest classes with their weights: 'class 3: 62%, class 7: 38%'."""
    if label.ndim == 0 or label.size == 1:
        return f"class {int(label.reshape(-1)[0])}"
    top = [index for index in np.argsort(-label, kind="stable")[:2] if label[index] >= 0.005]
    return ", ".join(f"class {int(index)}: {100 * float(label[index]):.0f}%" for index in top)


def contact_sheet(batches: Iterable[Any], count: int, columns: int = 8) -> np.ndarray:
    """uint8 [rows * (H + caption), columns * W, 3]: the first `count` examples of `batches`, captioned (images
    narrower than MIN_TILE enlarged by a whole factor, pixel by pixel)."""
    from PIL import Image, ImageDraw

    images, labels = [], []
    for batch in batches:
        batch_images, batch_labels = images_and_labels(batch)
        images.extend(batch_images)
        labels.extend(batch_labels)
        if len(images) >= count:
            break
    if not images:
        raise ConfigError("--show: the pipeline delivered no example to draw")
    images, labels = images[:count], labels[:count]
    scale = max(1, math.ceil(MIN_TILE / images[0].shape[1]))
    height, width = images[0].shape[0] * scale, images[0].shape[1] * scale
    columns = min(columns, len(images))
    rows = math.ceil(len(images) / columns)
    sheet = Image.new("RGB", (columns * width, rows * (height + CAPTION_HEIGHT)), "white")
    draw = ImageDraw.Draw(sheet)
    for index, (image, label) in enumerate(zip(images, labels)):
        low, high = float(image.min()), float(image.max())
        pixels = ((image - low) / (high - low) * 255 if high > low else np.zeros_like(image)).astype(np.uint8)
        tile = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")
        tile = tile.resize((width, height), Image.NEAREST) if scale > 1 else tile
        left, top = (index % columns) * width, (index // columns) * (height + CAPTION_HEIGHT)
        sheet.paste(tile, (left, top))
        draw.text((left + 2, top + height + 1), caption(np.asarray(label)), fill="black")
    return np.asarray(sheet)


def write_contact_sheet(batches: Iterable[Any], count: int, path: str) -> tuple[int, int]:
    """Writes the sheet at `path`, as its extension says (.png; .jpg is smaller), any directory made; returns its
    (width, height)."""
    from PIL import Image

    sheet = contact_sheet(batches, count)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    Image.fromarray(sheet).save(path)
    return sheet.shape[1], sheet.shape[0]
