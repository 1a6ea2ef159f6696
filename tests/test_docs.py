"""The docs as a reader meets them: README.md and every guide under docs/.

- A ```python block runs, each in a fresh Python process, inside a sandbox: a copy of `configs/`, small
  data where those configs point (the demo set under `~/.cache/tpu_pipeline` with HOME moved into the
  sandbox, a converted image folder at `data/flowers`), and an importable `my_project` package (the
  docs' stand-in for the reader's own code). A block that cannot run here (it needs a TPU, the
  network, long training, or names the reader's own objects) carries a marker on the line right
  before its fence, and is only compiled:

      <!-- not run: REASON -->

  `test_snippet_counts` prints how many blocks ran and how many were only compiled (`pytest -rP`),
  and every block of the README runs.
- A ```yaml block is a whole config (only top-level sections): it loads through `load_config` and
  its ops pass `check_ops`, as `tpu-pipeline` checks them. Marked blocks are only parsed.
- Every `tpu-pipeline COMMAND ...` line of a ```bash block names a real command, flags that command
  defines (`flags.DEFINE_*` in its module under tpu_pipeline/commands/, the global ones in cli.py)
  and config keys that exist; every script it names (`bash scripts/...`, `$(python scripts/deps.py)`)
  exists; other lines are pip, git clone, cd, or gcloud commands with flags the test knows (what runs on
  a TPU VM through `--command=` is checked like the rest).
- No page lists the package's dependencies by hand (`scripts/deps.py` prints them from setup.cfg), and
  every TPU pin it names is the one `scripts/setup_env.sh --tpu` installs.
- Every relative link points at a file that exists, and every `#anchor` at a heading of that
  markdown file (GitHub's slug rules).
- The README's guide table links every guide under docs/.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str            # path relative to the repository
    line: int           # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    found, lines = [], open(os.path.join(REPO, doc)).read().split("\n")
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        marker = NOT_RUN.match(lines[index - 1].strip()) if index else None
        found.append(Block(doc, index + 1, fence.group(1), "\n".join(lines[index + 1:end]) + "\n",
                           marker.group(1) if marker else None))
        index = end + 1
    return found


ALL_BLOCKS = [block for doc in DOCS for block in blocks(doc)]


def of(lang: str) -> list:
    return [pytest.param(b, id=f"{b.where}{'-compile-only' if b.not_run else ''}")
            for b in ALL_BLOCKS if b.lang == lang]


def test_markers_sit_right_before_a_python_or_yaml_fence():
    """A marker anywhere else (a typo, a blank line between it and the fence) would silently run nothing."""
    for doc in DOCS:
        lines = open(os.path.join(REPO, doc)).read().split("\n")
        for number, line in enumerate(lines, 1):
            if line.strip().startswith("<!-- not run"):
                assert NOT_RUN.match(line.strip()), f"{doc}:{number}: write the marker as <!-- not run: REASON -->"
                following = FENCE.match(lines[number]) if number < len(lines) else None
                assert following and following.group(1) in ("python", "yaml"), \
                    f"{doc}:{number}: the marker must be the line right before a ```python or ```yaml fence"


# --- the sandbox the snippets run in ------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> str:
    """A working directory laid out like the repository, with small data where its configs point."""
    from tpu_pipeline.records import ConvertOptions, convert, ensure_demo_dataset
    from tpu_pipeline.records.image_folder import ImageFolderSource

    from test_convert import FAST, make_image_folder

    root = tmp_path_factory.mktemp("docs_sandbox")
    shutil.copytree(os.path.join(REPO, "configs"), root / "configs")
    # configs/demo.yaml reads ~/.cache/tpu_pipeline/demo_shapes/...: the demo set, made small, there.
    demo_dir = yaml.safe_load(open(root / "configs" / "demo.yaml"))["data"]["source"]["dir"]
    assert demo_dir.startswith("~/"), demo_dir
    written = ensure_demo_dataset(str(root / "cache"), num_train=512, num_eval=128, num_shards=4)
    shutil.move(written, os.path.join(root, "home", demo_dir[2:]))
    # configs/image_folder.yaml reads ../data/flowers: docs/data.md's walk, converted small.
    make_image_folder(root / "images", per_class=4)
    convert(ImageFolderSource(str(root / "images"), splits="train=0.75,validation=0.25", seed=1),
            str(root / "data" / "flowers"), ConvertOptions(min_shards=1, **FAST))
    # The reader's own package, as the docs name it (`imports: [my_project.ops]`).
    (root / "my_project").mkdir()
    (root / "my_project" / "__init__.py").write_text("")
    (root / "my_project" / "ops.py").write_text('"""The reader\'s @register_op ops would live here."""\n')
    return str(root)


@pytest.fixture
def in_sandbox(sandbox, monkeypatch):
    monkeypatch.chdir(sandbox)
    monkeypatch.setenv("HOME", os.path.join(sandbox, "home"))
    monkeypatch.setenv("TPU_PIPELINE_CACHE", os.path.join(sandbox, "cache"))
    monkeypatch.syspath_prepend(sandbox)
    return sandbox


# --- ```python ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("python"))
def test_python_snippet(block: Block, request):
    """Each in a fresh Python, as a reader runs it: not in this process, whose CPU is split into 8
    devices and whose strategies would share collective keys with a snippet's own."""
    compile(block.code, block.where, "exec")
    if block.not_run:
        return  # compiled only: the marker says why
    sandbox = request.getfixturevalue("in_sandbox")
    script = os.path.join(sandbox, f"snippet_{block.doc.replace('/', '_').replace('.', '_')}_{block.line}.py")
    with open(script, "w") as handle:
        handle.write(block.code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([sandbox, REPO])}
    env.pop("TF_USE_LEGACY_KERAS", None)  # set by our conftest, not by a reader
    result = subprocess.run([sys.executable, script], cwd=sandbox, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{block.where} failed:\n{result.stderr[-4000:]}"


def test_snippet_counts():
    python = [b for b in ALL_BLOCKS if b.lang == "python"]
    compiled_only = [b for b in python if b.not_run]
    print(f"python snippets: {len(python) - len(compiled_only)} run, {len(compiled_only)} compiled only")
    for block in compiled_only:
        print(f"  compiled only: {block.where}: {block.not_run}")
    assert not [b.where for b in compiled_only if b.doc == "README.md"], "the README's snippets must run"
    assert len(python) - len(compiled_only) >= 4


# --- ```yaml ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml_snippet_is_a_valid_config(block: Block, request):
    from tpu_pipeline.config import Config, load_config
    from tpu_pipeline.ops import check_ops

    raw = yaml.safe_load(block.code)
    if block.not_run:
        return
    assert isinstance(raw, dict) and set(raw) <= set(Config.model_fields), (
        f"{block.where}: a ```yaml block is a whole config (top-level keys among {sorted(Config.model_fields)}); "
        f"make it one, or mark it <!-- not run: REASON -->")
    sandbox = request.getfixturevalue("in_sandbox")
    path = os.path.join(sandbox, "configs", f"snippet_{block.doc.replace('/', '_')}_{block.line}.yaml")
    with open(path, "w") as handle:
        handle.write(block.code)
    config = load_config(path)
    check_ops(config.data, "data")
    check_ops(config.eval_data, "eval_data")


# --- ```bash ------------------------------------------------------------------------------------


def command_flags() -> dict[str, dict[str, bool]]:
    """command → {flag: is boolean}, from the `flags.DEFINE_*` calls of its module (and cli.py's and
    commands/_common.py's)."""
    from tpu_pipeline.cli import COMMANDS

    define = re.compile(r"flags\.DEFINE_(\w+)\(\s*\"([^\"]+)\"")

    def defined(path: str) -> dict[str, bool]:
        return {name: kind in ("bool", "boolean") for kind, name in define.findall(open(path).read())}

    common = defined(os.path.join(REPO, "tpu_pipeline", "cli.py"))
    common.update(defined(os.path.join(REPO, "tpu_pipeline", "commands", "_common.py")))  # shared: --workers
    common.update({name: True for name in ("help", "helpfull", "helpshort")}, verbosity=False, v=False)
    return {name: {**common, **defined(importlib.util.find_spec(module).origin)}
            for name, (module, _) in COMMANDS.items()}


def bash_lines() -> list:
    found = []
    for block in ALL_BLOCKS:
        if block.lang == "bash":
            for offset, line in enumerate(block.code.split("\n"), 1):
                if line.strip() and not line.strip().startswith("#"):
                    found.append(pytest.param(line, id=f"{block.doc}:{block.line + offset}"))
    return found


# gcloud commands the guides use, with the flags each takes (from the gcloud reference pages of these
# commands, https://cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm and .../storage/buckets/create).
GCLOUD = {
    ("compute", "tpus", "tpu-vm", "create"): {"zone", "accelerator-type", "version"},
    ("compute", "tpus", "tpu-vm", "ssh"): {"zone", "worker", "command"},
    ("compute", "tpus", "tpu-vm", "scp"): {"zone", "worker", "recurse"},
    ("compute", "tpus", "tpu-vm", "delete"): {"zone"},
    ("compute", "tpus", "tpu-vm", "versions", "list"): {"zone"},
    ("storage", "buckets", "create"): {"location"},
}
PIP = {"install", "uninstall", "list"}


def check_command(words: list[str], line: str) -> None:
    """One command: `tpu-pipeline` (or a virtual environment's), `bash scripts/...`, `python scripts/...`,
    pip, the gcloud commands above (the command `--command=` runs on the VM checked the same way), git clone, cd."""
    while words and re.match(r"^[A-Z][A-Z0-9_]*=", words[0]):
        words = words[1:]  # VAR=value before the command
    for word in words:  # a script named anywhere, e.g. in $(python scripts/deps.py), exists
        script = word.strip("$()")
        if script.startswith("scripts/"):
            assert os.path.isfile(os.path.join(REPO, script)), f"{script} does not exist: {line!r}"
    program = words[0]
    if program in ("tpu-pipeline", ".venv/bin/tpu-pipeline", ".venv-tpu/bin/tpu-pipeline"):
        check_tpu_pipeline(words[1:], line)
    elif program in ("bash", "python", "python3", ".venv/bin/python", ".venv-tpu/bin/python") and words[1] != "-m":
        assert words[1].startswith("scripts/"), f"{program} runs a script of this repository: {line!r}"
    elif program == "pip" or words[1:3] == ["-m", "pip"]:
        command = words[1] if program == "pip" else words[3]
        assert command in PIP, f"pip {command}: not a pip command this page should need: {line!r}"
    elif program == "gcloud":
        known = next((flags for command, flags in GCLOUD.items() if tuple(words[1:1 + len(command)]) == command), None)
        assert known is not None, f"not a gcloud command the tests know ({sorted(GCLOUD)}): {line!r}"
        for word in words:
            if word.startswith("--"):
                name, _, value = word[2:].partition("=")
                assert name in known, f"gcloud {' '.join(words[1:4])} has no flag --{name} here: {line!r}"
                if name == "command":
                    for part in value.split("&&"):
                        check_command(shlex.split(part), line)
    else:
        assert (program == "git" and words[1] == "clone") or program == "cd", (
            f"a ```bash line runs tpu-pipeline, a script of this repository, pip, gcloud compute tpus tpu-vm, "
            f"git clone or cd: {line!r}")


def check_tpu_pipeline(words: list[str], line: str) -> None:
    from tpu_pipeline.config.loader import config_keys

    flags = command_flags()
    assert words[0] in flags, f"no command {words[0]!r}; commands: {sorted(flags)}"
    known, keys = flags[words[0]], config_keys()
    rest = iter(words[1:])
    for word in rest:
        if word.startswith("--"):
            name, has_value, _ = word[2:].partition("=")
            boolean = known[name] if name in known else (True if known.get(name[2:]) and name.startswith("no") else None)
            assert boolean is not None, f"tpu-pipeline {words[0]} has no flag --{name}; it has: {sorted(known)}"
            if not boolean and not has_value:
                next(rest, None)  # the flag's value
        elif "=" in word and word.split("=")[0] != "key":
            # up to a list index: an op's arguments are free (data.preprocess.0.size)
            key = re.split(r"\.\d+(?:\.|$)", word.split("=")[0])[0]
            assert any(k == key or k.startswith(key + ".") for k in keys), f"{word!r}: no config key {key!r}"


@pytest.mark.parametrize("line", bash_lines())
def test_bash_line_names_real_commands_flags_and_keys(line: str):
    words = [w.strip("[]") for w in shlex.split(line, comments=True)]
    check_command([w for w in words if w and w != "..."], line)


# --- links --------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text only, lower case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set[str]:
    seen: dict[str, int] = {}
    result, in_fence = set(), False
    for line in open(path).read().split("\n"):
        in_fence ^= line.startswith("```")
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not in_fence:
            base = slug(heading.group(1))
            result.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return result


def links(doc: str) -> list[tuple[int, str]]:
    found, in_fence = [], False
    for number, line in enumerate(open(os.path.join(REPO, doc)).read().split("\n"), 1):
        in_fence ^= line.startswith("```")
        if not in_fence:
            found += [(number, target) for target in re.findall(r"\[[^\]\n]*\]\(([^)\s]+)\)", line)]
    return found


def test_slugs_follow_github():
    assert slug("Training (`tpu-pipeline train`)") == "training-tpu-pipeline-train"
    assert slug("Seeds: one tree, rooted at `data.seed`") == "seeds-one-tree-rooted-at-dataseed"
    assert slug("Is my pipeline fast enough? (`bench`, `doctor`)") == "is-my-pipeline-fast-enough-bench-doctor"
    assert slug("Skipping bad records (`data.on_error: skip`)") == "skipping-bad-records-dataon_error-skip"


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_anchors_resolve(doc: str):
    broken = []
    for number, target in links(doc):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(REPO, os.path.dirname(doc), path)) if path else os.path.join(REPO, doc)
        if not os.path.exists(full):
            broken.append(f"{doc}:{number}: {target}: no file {os.path.relpath(full, REPO)}")
        elif anchor and (not full.endswith(".md") or anchor not in anchors(full)):
            broken.append(f"{doc}:{number}: {target}: no heading #{anchor} in {os.path.relpath(full, REPO)}")
    assert not broken, "\n".join(broken)


def test_the_readme_guide_table_links_every_guide():
    readme = open(os.path.join(REPO, "README.md")).read()
    table = readme[readme.index("## Guides"):]
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", table))
    missing = sorted(set(doc for doc in DOCS if doc.startswith("docs/")) - linked)
    assert not missing, f"add a row for each to the README's guide table: {missing}"


# --- what the docs say about installing ----------------------------------------------------------


def install_texts() -> list[tuple[str, str]]:
    """(where, text) of every page and every notebook cell."""
    import nbformat

    texts = [(doc, open(os.path.join(REPO, doc)).read()) for doc in DOCS]
    for path in sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb"))):
        notebook = nbformat.read(path, as_version=4)
        texts += [(f"{os.path.relpath(path, REPO)} cell {n}", cell.source) for n, cell in enumerate(notebook.cells)]
    return texts


def test_no_page_lists_the_dependencies_by_hand():
    """setup.cfg is the one list: a `pip install` that names two of its projects has copied it, and will drift
    (docs/training.md's copy once lacked google-crc32c, without which `train` stops at an import)."""
    spec = importlib.util.spec_from_file_location("deps", os.path.join(REPO, "scripts", "deps.py"))
    deps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deps)
    projects = {deps.project_name(r) for r in deps.requirements()} - set(deps.TENSORFLOW_FAMILY)
    assert "google-crc32c" in projects
    copied = []
    for where, text in install_texts():
        for line in text.split("\n"):
            for command in re.findall(r"pip install[^`\n]*", line):
                named = {deps.project_name(word.strip("\"'`,")) for word in command.split()[2:]} & projects
                if len(named) >= 2:
                    copied.append(f"{where}: {command.strip()} (names {sorted(named)}; use $(python scripts/deps.py))")
    assert not copied, "\n".join(copied)


def test_every_tpu_pin_named_is_the_one_setup_env_installs():
    from tpu_pipeline.tensorflow_install import TESTED_LIBTPU, TESTED_TPU_TENSORFLOW

    setup_env = open(os.path.join(REPO, "scripts", "setup_env.sh")).read()
    assert f'TPU_TENSORFLOW="tensorflow-tpu=={TESTED_TPU_TENSORFLOW}"' in setup_env
    assert f'TPU_LIBTPU="libtpu=={TESTED_LIBTPU}"' in setup_env
    minor = ".".join(TESTED_TPU_TENSORFLOW.split(".")[:2])
    wrong = []
    for where, text in install_texts():
        wrong += [f"{where}: tensorflow-tpu=={v}" for v in re.findall(r"tensorflow-tpu==([\d.]+\d)", text)
                  if v != TESTED_TPU_TENSORFLOW]
        wrong += [f"{where}: libtpu=={v}" for v in re.findall(r"libtpu==([\d.]+\d)", text) if v != TESTED_LIBTPU]
        wrong += [f"{where}: tf-keras~={v}" for v in re.findall(r"tf-keras~=(\d+\.\d+)", text) if v != minor]
        if re.search(r"Supported: TensorFlow 2\.\d+ and newer", text):
            wrong.append(f"{where}: claims a TensorFlow range; say what is tested (README, 'On a TPU')")
    assert not wrong, "\n".join(wrong)


def test_the_readme_says_which_tensorflows_are_tested_and_how():
    from tpu_pipeline.tensorflow_install import TESTED_TPU_TENSORFLOW

    readme = open(os.path.join(REPO, "README.md")).read()
    section = readme[readme.index("## The two commands"):readme.index("## Quickstart (Python)")]
    for needed in ("bash scripts/setup_env.sh --tpu", "(docs/tpu.md)", f"tensorflow-tpu` {TESTED_TPU_TENSORFLOW}",
                   "`.ci/run`", "bash scripts/run_tests.sh --tpu", ".venv-tpu"):
        assert needed in section, f"the README's 'On a TPU' paragraph should name {needed!r}"
    features = readme[:readme.index("## The two commands")]
    assert "(docs/tpu.md)" in features, "the feature list should link docs/tpu.md"
