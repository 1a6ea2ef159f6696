"""An image folder with one sub-folder per class (keras.utils.image_dataset_from_directory's layout).

    root/cat/1.jpg, root/cat/more/2.png, root/dog/3.jpg  →  class_names [cat, dog], labels 0, 1

Each image is kept as its original encoded bytes (no quality loss, no size change) unless
`reencode` asks for JPEG or PNG. Every image is decoded once anyway: that is how an unreadable file
is caught here, with its path, instead of mid-training on a TPU.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Iterator, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.records.convert_input import ItemError
from tpu_pipeline.records.examples import feature, serialize, spec, tf_error_reason
from tpu_pipeline.records.sharding import RECORD_OVERHEAD, assign_splits, split_fractions
from tpu_pipeline.system import local_path

# The extensions image_dataset_from_directory accepts.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
REENCODE = ("", "jpeg", "png")


@dataclasses.dataclass(frozen=True)
class ImageFile:
    path: str
    relpath: str
    size: int
    mtime_ns: int
    label: int


def _walk_local(directory: str) -> Iterator[tuple[str, int, int]]:
    for parent, dirs, names in os.walk(directory, followlinks=True):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(parent, name)
            stat = os.stat(path)
            yield path, stat.st_size, stat.st_mtime_ns


def _walk_remote(directory: str) -> Iterator[tuple[str, int, int]]:
    for parent, dirs, names in tf.io.gfile.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = tf.io.gfile.join(parent, name)
            stat = tf.io.gfile.stat(path)
            yield path, stat.length, stat.mtime_nsec


def list_images(root: str) -> tuple[list[str], list[ImageFile]]:
    """Class names (sorted sub-folder names, as Keras orders them) and every image file below them."""
    remote = "://" in root
    if not tf.io.gfile.isdir(root):
        raise DataError(f"image-folder: {root!r} is not a directory; give the folder that holds one sub-folder per class")
    class_names = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(root) if tf.io.gfile.isdir(tf.io.gfile.join(root, n)))
    if not class_names:
        raise DataError(
            f"image-folder: {root!r} has no sub-folders; put each class's images in its own sub-folder, "
            "e.g. root/cat/1.jpg and root/dog/2.jpg"
        )
    files: list[ImageFile] = []
    for label, name in enumerate(class_names):
        class_dir = tf.io.gfile.join(root, name)
        for path, size, mtime in (_walk_remote if remote else _walk_local)(class_dir):
            if path.lower().endswith(IMAGE_EXTENSIONS):
                relpath = path[len(root):].lstrip("/").replace(os.sep, "/")
                files.append(ImageFile(path, relpath, int(size), int(mtime), label))
    if not files:
        raise DataError(
            f"image-folder: no image files ({', '.join(IMAGE_EXTENSIONS)}) under the class folders of {root!r}"
        )
    return class_names, files


class ImageFolderSource:
    """Lists the folder once; `encode` reads, checks and serializes one image (in a worker thread)."""

    kind = "image-folder"

    def __init__(
        self, root: str, splits: str = "train", seed: int = 0, shuffle: bool = True,
        reencode: str = "", jpeg_quality: int = 95,
    ) -> None:
        if reencode not in REENCODE:
            raise ConfigError(f"--reencode must be none, jpeg or png (given: {reencode!r})")
        if not 1 <= jpeg_quality <= 100:
            raise ConfigError(f"--jpeg_quality must be in 1..100 (given: {jpeg_quality})")
        self.root = local_path(root, absolute=True)
        self.root = self.root.rstrip("/")
        self.name = os.path.basename(self.root)
        self.reencode, self.jpeg_quality, self.seed, self.shuffle = reencode, jpeg_quality, seed, shuffle
        self.fractions = split_fractions(splits)
        self._class_names, self.files = list_images(self.root)
        self._splits = {name: [self.files[i] for i in indices]
                        for name, indices in assign_splits(len(self.files), self.fractions, seed, shuffle).items()}

    def split_sizes(self) -> dict[str, int]:
        return {name: len(files) for name, files in self._splits.items()}

    def estimate_bytes(self, split: str) -> int:
        return sum(f.size + len(f.relpath) + 64 + RECORD_OVERHEAD for f in self._splits[split])

    def items(self, split: str, start: int) -> Iterator[ImageFile]:
        return iter(self._splits[split][start:])

    def encode(self, item: ImageFile) -> bytes:
        try:
            with tf.io.gfile.GFile(item.path, "rb") as handle:
                data = handle.read()
        except (OSError, tf.errors.OpError) as error:
            raise ItemError(item.path, f"cannot read the file ({tf_error_reason(error)})") from None
        try:
            channels = 3 if self.reencode == "jpeg" else 0  # JPEG holds 1 or 3 channels, never alpha
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
            if self.reencode == "jpeg":
                data = tf.io.encode_jpeg(image, quality=self.jpeg_quality).numpy()
            elif self.reencode == "png":
                data = tf.io.encode_png(image).numpy()
        except tf.errors.OpError as error:
            raise ItemError(item.path, f"not a readable image ({tf_error_reason(error)})") from None
        height, width = int(image.shape[0]), int(image.shape[1])
        return serialize({
            "image": feature(data, "string"),
            "label": feature(item.label, "int64"),
            "label_name": feature(self._class_names[item.label], "string"),
            "height": feature(height, "int64"),
            "width": feature(width, "int64"),
            "filename": feature(item.relpath, "string"),
        })

    def features(self) -> dict[str, dict[str, Any]]:
        return {
            "image": spec("string"), "label": spec("int64"), "label_name": spec("string"),
            "height": spec("int64"), "width": spec("int64"), "filename": spec("string"),
        }

    def class_names(self) -> Optional[list[str]]:
        return list(self._class_names)

    def identity(self) -> dict[str, Any]:
        listing = hashlib.sha256()
        for f in self.files:
            listing.update(f"{f.relpath}\t{f.size}\t{f.mtime_ns}\n".encode())
        return {
            "kind": self.kind, "root": self.root, "listing": listing.hexdigest(), "splits": self.fractions,
            "seed": self.seed, "shuffle": self.shuffle, "reencode": self.reencode, "jpeg_quality": self.jpeg_quality,
        }

    def describe(self) -> dict[str, Any]:
        extensions: dict[str, int] = {}
        for f in self.files:
            ext = os.path.splitext(f.relpath)[1].lower()
            extensions[ext] = extensions.get(ext, 0) + 1
        return {
            "kind": self.kind, "path": self.root, "num_files": len(self.files), "extensions": extensions,
            "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle, "reencode": self.reencode or None,
        }
