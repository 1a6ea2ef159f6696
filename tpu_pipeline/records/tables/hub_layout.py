"""Which files make which split of a dataset laid out as the Hugging Face hub and `datasets` lay them out.

Three layouts, found from the path given to `convert --from parquet|hf`:

- **`save_to_disk`** (`datasets.Dataset[Dict].save_to_disk`): `dataset_dict.json` names the splits, each a
  folder whose `state.json` lists its `data-0000X-of-0000N.arrow` files (Arrow IPC streams) and whose
  `dataset_info.json` holds the features (ClassLabel names). A single saved Dataset is one split,
  named by its `state.json` (`_split`), else `train`.
- **A hub repository's README.md** with `configs:` in its YAML header (what `huggingface-cli download`
  brings): each config maps splits to globs (`data_files: [{split: train, path: data/train-*}]`);
  `--hf_config NAME` picks one (default: the one marked `default: true`, else the only one).
- **Parquet files by name**, as `datasets.load_dataset("parquet", data_dir=...)` infers them:
  `{split}-00000-of-00012.parquet` anywhere (any split name), else a folder named for a split
  (`train/`, `validation/`, `test/`, also `dev`, `valid`, `eval`...), else a file name holding one
  (`my_train.parquet`), else every file is `train`. Several top-level folders that each hold a whole
  dataset (per-config folders: `cola/train-...`, `default/train/0000.parquet`) are configs.

Class names come from the `huggingface` key of the Parquet schema metadata, or `dataset_info.json`.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from typing import Any, Optional

import tensorflow as tf
import yaml

from tpu_pipeline.errors import ConfigError, DataError

PARQUET = "parquet"
ARROW = "arrow"
# datasets' split keywords (datasets/data_files.py: SPLIT_KEYWORDS), canonical name first.
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SHARDED = re.compile(r"^(?P<split>\w+?)-\d{5}-of-\d{5}(?!\d)")  # older push_to_hub added -HASH
_SEP = r"[-._ 0-9]"


@dataclasses.dataclass
class Layout:
    """What a dataset path holds: its format, its splits (each a list of files), and what we know of its features."""

    root: str
    format: str  # PARQUET | ARROW
    splits: dict[str, list[str]]
    how: str  # how the splits were found, in words (describe(), the summary)
    config: Optional[str] = None
    hf_features: Optional[dict[str, Any]] = None  # datasets' features dict (dataset_info.json), if any
    ignored: list[str] = dataclasses.field(default_factory=list)  # files no split rule matched


def _is_hidden(relative: str) -> bool:
    """What `datasets` leaves out unless a pattern names it (datasets/data_files.py, `resolve_pattern`): a file or
    folder whose name starts with a dot, or a file inside a folder whose name starts with a double underscore
    (`__pycache__`). A single underscore (`_part.parquet`) is data."""
    parts = relative.split("/")
    return any(part.startswith(".") for part in parts) or any(part.startswith("__") for part in parts[:-1])


def _walk(root: str, suffix: str, hidden: bool = False) -> list[str]:
    """Files ending in `suffix` under `root`, as sorted paths relative to it (hidden ones left out, unless
    `hidden`: a README's patterns may name them)."""
    found = []
    for parent, _, names in tf.io.gfile.walk(root):
        for name in names:
            relative = os.path.relpath(tf.io.gfile.join(parent, name), root).replace(os.sep, "/")
            if name.endswith(suffix) and (hidden or not _is_hidden(relative)):
                found.append(relative)
    return sorted(found)


def _read_json(path: str) -> Any:
    with tf.io.gfile.GFile(path, "r") as handle:
        return json.loads(handle.read())


def _keyword_split(name: str, folder: bool) -> Optional[str]:
    """The canonical split a folder name or a file name (with its extension) names, by datasets' patterns:
    a folder named `train`, `train-2`, `my_train`; a file `train.parquet`, `my-train-0.parquet`."""
    name = name.lower()
    for split, keywords in SPLIT_KEYWORDS.items():
        for keyword in keywords:
            if re.search(rf"(^|{_SEP}){keyword}({_SEP}|$)" if folder else rf"(^|{_SEP}){keyword}{_SEP}", name):
                return split
    return None


def splits_by_name(files: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """Split → files (paths relative to the root) by datasets' rules, in their order of precedence; how
    they were found; and the files no rule gave a split (left out, and listed)."""
    sharded = {f: _SHARDED.match(f.rsplit("/", 1)[-1]) for f in files}
    if any(sharded.values()):
        found = {f: m.group("split") for f, m in sharded.items() if m}
        how = "file names {split}-NNNNN-of-NNNNN"
    else:
        found = {}
        for f in files:
            split = next((s for s in (_keyword_split(d, True) for d in f.split("/")[:-1]) if s), None)
            if split:
                found[f] = split
        how = "folder names (train/, validation/, test/ ...)"
        if not found:
            found = {f: s for f in files if (s := _keyword_split(f.rsplit("/", 1)[-1], False))}
            how = "file names holding train, validation or test"
        if not found:
            return {"train": list(files)}, "no split named by the paths: every file is train", []
    return _group(found), how, [f for f in files if f not in found]


def _group(assignment: dict[str, Optional[str]]) -> dict[str, list[str]]:
    splits: dict[str, list[str]] = {}
    for name in ("train", "validation", "test"):  # the usual order first, then others by name
        if name in assignment.values():
            splits[name] = []
    for path, split in sorted(assignment.items()):
        if split:
            splits.setdefault(split, []).append(path)
    return splits


def _readme_configs(root: str) -> Optional[list[dict[str, Any]]]:
    path = tf.io.gfile.join(root, "README.md")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as handle:
        text = handle.read()
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return None
    try:
        header = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as error:
        raise DataError(f"{path}: its YAML header does not parse ({str(error).splitlines()[0]}); fix it, or "
                        "give the folder of the files you want") from None
    configs = header.get("configs") if isinstance(header, dict) else None
    return configs if isinstance(configs, list) and configs else None


def _glob(root: str, files: list[str], pattern: str) -> list[str]:
    """The files a hub `data_files` pattern matches, as `datasets` resolves it (datasets/data_files.py,
    `resolve_pattern`: fsspec's glob, `fsspec.utils.glob_translate`, which is CPython's `glob.translate` with
    recursive=True and "/" as the only separator):

    - `*`, `?` and `[...]` (`[!...]`: not those) match within one folder or file name, never across a `/`:
      `*.parquet` is the files at the top, not those of a sub-folder (another config's);
    - `**` as a whole path component matches any number of folders (`data/**`, `**/*.parquet`); anywhere else
      (`**.parquet`) the pattern is invalid, and datasets refuses it;
    - a hidden name (`.x`) matches only where the pattern names a hidden part there too, and a file under a
      `__special` folder only where the pattern names such a folder (`_unrequested`).
    """
    wanted = [part for part in pattern.strip("/").split("/") if part not in ("", ".")]
    if any("**" in part and part != "**" for part in wanted):
        raise DataError(f"{root}/README.md: data_files pattern {pattern!r}: '**' can only be a whole path component "
                        "(data/**, **/*.parquet), as datasets requires; fix the pattern")
    return [f for f in files if _matches(wanted, f.split("/")) and not _unrequested(f, wanted)]


def _matches(pattern: list[str], parts: list[str]) -> bool:
    """`parts` (a file's path) matched by `pattern`, component by component; `**` spans any number of them
    (at the end, at least one: it names files)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if not rest:
            return bool(parts)
        return any(_matches(rest, parts[skip:]) for skip in range(len(parts)))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def _unrequested(path: str, pattern: list[str]) -> bool:
    """datasets' two exclusions (`_is_unrequested_hidden_file_or_is_inside_unrequested_hidden_dir`,
    `_is_inside_unrequested_special_dir`): the path has more hidden parts than the pattern names, or more
    `__` folders."""
    parts = path.split("/")

    def hidden(names: list[str]) -> int:
        return sum(1 for name in names if name.startswith(".") and set(name) != {"."})

    def special(names: list[str]) -> int:
        return sum(1 for name in names[:-1] if name.startswith("__"))

    return hidden(parts) != hidden(pattern) or special(parts) != special(pattern)


def _from_readme(root: str, configs: list[dict[str, Any]], config: Optional[str], files: list[str]) -> Layout:
    names = [str(c.get("config_name", "default")) for c in configs]
    if config is None:
        defaults = [n for n, c in zip(names, configs) if c.get("default")]
        if len(names) == 1 or defaults:
            config = defaults[0] if defaults else names[0]
        else:
            raise ConfigError(f"{root}: its README.md names {len(names)} configs ({', '.join(names[:20])}); "
                              "pick one with --hf_config NAME")
    if config not in names:
        raise ConfigError(f"--hf_config {config}: {root}/README.md names the configs {', '.join(names[:20])}")
    entry = configs[names.index(config)]
    data_files = entry.get("data_files")
    if data_files is None and entry.get("data_dir"):
        data_files = [{"split": s, "path": f"{entry['data_dir']}/**"} for s in ("train",)]
    if isinstance(data_files, str):
        data_files = [{"split": "train", "path": data_files}]
    elif isinstance(data_files, list) and data_files and isinstance(data_files[0], str):
        data_files = [{"split": "train", "path": data_files}]
    elif isinstance(data_files, dict):
        data_files = [{"split": k, "path": v} for k, v in data_files.items()]
    if not isinstance(data_files, list) or not data_files:
        raise DataError(f"{root}/README.md: config {config!r} has no data_files this version reads; give the "
                        "folder of the Parquet files instead")
    splits: dict[str, list[str]] = {}
    for item in data_files:
        patterns = item.get("path")
        patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
        matched = sorted({f for p in patterns for f in _glob(root, files, p)})
        if not matched:
            raise DataError(f"{root}/README.md: config {config!r}, split {item.get('split')!r}: {patterns} matches no "
                            f"Parquet file under {root}; download the config's files too (huggingface-cli download "
                            f"REPO --repo-type dataset --include '{patterns[0] if patterns else '*'}')")
        splits[str(item.get("split", "train"))] = matched
    return Layout(root, PARQUET, splits, f"README.md config {config!r}", config=config)


def _configs_by_folder(files: list[str]) -> Optional[dict[str, list[str]]]:
    """Per-config folders: every file lies in a top-level folder that is not `data` nor a split's name,
    and there are several such folders."""
    tops: dict[str, list[str]] = {}
    for f in files:
        if "/" not in f:
            return None
        top, rest = f.split("/", 1)
        if top == "data" or _keyword_split(top, True) or _SHARDED.match(top):
            return None
        tops.setdefault(top, []).append(rest)
    return tops if len(tops) > 1 else None


def find_parquet(path: str, config: Optional[str]) -> Layout:
    """The splits of Parquet files: a file, a quoted glob, or a folder (README configs, or file names)."""
    if any(c in path for c in "*?["):
        matches = sorted(tf.io.gfile.glob(path))
        if not matches:
            raise DataError(f"parquet: {path!r} matches no file")
        root = os.path.dirname(path.split("*")[0].split("?")[0].split("[")[0].rstrip("/")) or "."
        files = [os.path.relpath(m, root).replace(os.sep, "/") for m in matches if m.endswith(".parquet")]
        splits, how, ignored = splits_by_name(files)
        return Layout(root, PARQUET, splits, how, ignored=ignored)
    if not tf.io.gfile.exists(path):
        raise DataError(f"parquet: {path!r} does not exist")
    if not tf.io.gfile.isdir(path):
        root, name = os.path.split(path)
        splits, how, _ = splits_by_name([name])
        if not splits:
            splits = {"train": [name]}
        return Layout(root or ".", PARQUET, splits, how)
    if _is_save_to_disk(path):
        raise ConfigError(f"--from parquet: {path} was written by datasets' save_to_disk (Arrow files, "
                          f"{'dataset_dict.json' if tf.io.gfile.exists(tf.io.gfile.join(path, 'dataset_dict.json')) else 'state.json'}); "
                          "convert it with --from hf")
    files = _walk(path, ".parquet")
    if not files:
        raise DataError(f"parquet: {path} holds no *.parquet file")
    configs = _readme_configs(path)
    if configs is not None:
        return _from_readme(path, configs, config, _walk(path, ".parquet", hidden=True))
    by_folder = _configs_by_folder(files)
    if by_folder is not None:
        if config is None:
            raise ConfigError(f"{path} holds one folder per config ({', '.join(sorted(by_folder)[:20])}); pick one "
                              f"with --hf_config NAME, or give its folder ({path.rstrip('/')}/{sorted(by_folder)[0]})")
        if config not in by_folder:
            raise ConfigError(f"--hf_config {config}: {path} holds the configs {', '.join(sorted(by_folder)[:20])}")
        splits, how, ignored = splits_by_name(by_folder[config])
        return Layout(tf.io.gfile.join(path, config), PARQUET, splits, how, config=config, ignored=ignored)
    if config is not None:
        raise ConfigError(f"--hf_config {config}: {path} holds a single config (no README.md configs, no config folders); "
                          "leave --hf_config out")
    splits, how, ignored = splits_by_name(files)
    return Layout(path, PARQUET, splits, how, ignored=ignored)


def _is_save_to_disk(path: str) -> bool:
    return any(tf.io.gfile.exists(tf.io.gfile.join(path, name)) for name in ("dataset_dict.json", "state.json"))


def _split_folder(folder: str) -> tuple[list[str], Optional[dict[str, Any]]]:
    state_path = tf.io.gfile.join(folder, "state.json")
    if not tf.io.gfile.exists(state_path):
        raise DataError(f"hf: {folder} has no state.json; it is not a split saved by datasets' save_to_disk")
    state = _read_json(state_path)
    files = [entry["filename"] for entry in state.get("_data_files", []) if isinstance(entry, dict) and "filename" in entry]
    if not files:
        raise DataError(f"hf: {state_path} lists no data files (_data_files)")
    for name in files:
        if not tf.io.gfile.exists(tf.io.gfile.join(folder, name)):
            raise DataError(f"hf: {state_path} lists {name}, which is missing from {folder}; copy the whole folder again")
    info_path = tf.io.gfile.join(folder, "dataset_info.json")
    info = _read_json(info_path) if tf.io.gfile.exists(info_path) else {}
    features = info.get("features") if isinstance(info, dict) else None
    return files, features if isinstance(features, dict) else None


def find_hf(path: str, config: Optional[str]) -> Layout:
    """A `save_to_disk` folder (a DatasetDict or one Dataset); a folder of hub Parquet files goes to find_parquet."""
    if not tf.io.gfile.isdir(path):
        raise DataError(f"hf: {path!r} is not a folder; give the folder datasets' save_to_disk wrote "
                        "(or a hub download of Parquet files)")
    if not _is_save_to_disk(path):
        if _walk(path, ".parquet"):
            return find_parquet(path, config)
        raise DataError(f"hf: {path} holds neither dataset_dict.json nor state.json (what save_to_disk writes) "
                        "nor *.parquet files")
    if config is not None:
        raise ConfigError("--hf_config: only for hub repositories of Parquet files; a save_to_disk folder holds one config")
    dict_path = tf.io.gfile.join(path, "dataset_dict.json")
    splits: dict[str, list[str]] = {}
    features = None
    if tf.io.gfile.exists(dict_path):
        names = _read_json(dict_path).get("splits") or []
        if not names:
            raise DataError(f"hf: {dict_path} names no splits")
        for name in names:
            folder = tf.io.gfile.join(path, name)
            files, found = _split_folder(folder)
            splits[str(name)] = [f"{name}/{f}" for f in files]
            features = features or found
        how = "dataset_dict.json"
    else:
        files, features = _split_folder(path)
        state = _read_json(tf.io.gfile.join(path, "state.json"))
        splits[str(state.get("_split") or "train")] = files
        how = "state.json (one saved split)"
    return Layout(path, ARROW, splits, how, hf_features=features)


def hf_features_of_schema(metadata: Optional[dict[bytes, bytes]]) -> Optional[dict[str, Any]]:
    """datasets' features from a Parquet/Arrow schema's `huggingface` metadata key, if any."""
    raw = (metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        info = json.loads(raw).get("info", {})
    except (ValueError, AttributeError):
        return None
    features = info.get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else None


def class_names_of(features: Optional[dict[str, Any]], column: str) -> Optional[list[str]]:
    """A ClassLabel column's names in id order, from datasets' features (None: not a ClassLabel)."""
    entry = (features or {}).get(column)
    if isinstance(entry, dict) and entry.get("_type") == "ClassLabel" and isinstance(entry.get("names"), list):
        return [str(name) for name in entry["names"]]
    return None
