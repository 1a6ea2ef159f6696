"""`tpu-pipeline COMMAND [--flags] [key=value ...]`: one absl app with subcommands.

Positional `key=value` arguments override any config key (e.g. `data.batch_size=256`).
A TpuPipelineError is printed as one clear message (exit 2), never as a stack trace; so is
Ctrl-C (exit 130): one line saying what the command kept (a command module's `interrupted()`
says it: train its last checkpoint, convert its finished shards; the others wrote nothing).
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Sequence

from tpu_pipeline.system import fewer_collections  # does not import TensorFlow (tests/test_cli_habits.py)

fewer_collections()  # before TensorFlow's import, its first million objects (tpu_pipeline/system.py)
_USER_SET_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL" in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import logging  # noqa: E402

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from tpu_pipeline.errors import PeerFailure, TpuPipelineError  # noqa: E402
from tpu_pipeline.system import native_stderr_silenced  # noqa: E402

flags.DEFINE_multi_string("config", None, "YAML config file (local or gs://); repeat it to layer files (later wins). "
                          "Without it, the built-in demo config.")
flags.DEFINE_string("params_override", None, "a YAML mapping, or a .yaml file, layered over the config files "
                    "(tensorflow/models' flag); key=value arguments apply after it")

# name → (module, help). A command module is imported only when it runs, so each command
# defines only its own absl flags and a broken optional dependency breaks only its command.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tpu_pipeline.commands.demo", "build the demo input pipeline and print its throughput"),
    "train": ("tpu_pipeline.commands.train", "train and evaluate a model from a config (the main job)"),
    "convert": ("tpu_pipeline.commands.convert", "convert images, CSV/NumPy, TFDS, Parquet/HF, text or chat data to TFRecord shards"),
    "bench": ("tpu_pipeline.commands.bench", "measure one input pipeline: examples/s, CPU per example, ceilings"),
    "doctor": ("tpu_pipeline.commands.doctor", "measure each stage, name the bottleneck, propose a tuned config"),
    "verify": ("tpu_pipeline.commands.verify", "read every record once and list damaged or misfitting ones (exit 1 if any)"),
    "config": ("tpu_pipeline.commands.config", "print the fully resolved config (files layered, overrides, defaults)"),
    "serve": ("tpu_pipeline.commands.serve", "run a tf.data service dispatcher or worker (preprocessing on other CPUs)"),
    "devices": ("tpu_pipeline.commands.devices", "print what the resolver finds: kind, replicas, hosts, devices, memory"),
}


def _usage() -> str:
    lines = ["usage: tpu-pipeline COMMAND [--config FILE] [--flags] [key=value ...]", "", "commands:"]
    lines += [f"  {name:10s} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "Run `tpu-pipeline COMMAND --helpfull` for a command's flags."]
    return "\n".join(lines)


class _OthersInfoFilter(logging.Filter):
    """Drops INFO lines that TensorFlow, Keras and JAX log through absl (e.g. "Sharding callback duration"
    at every checkpoint, JAX's "Unable to initialize backend 'tpu'" off a TPU), and matplotlib's font-cache
    notice (Keras 3's `import keras` imports matplotlib where it is installed); ours and every other warning
    stay. `--verbosity` keeps them all."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace(os.sep, "/")
        if "/matplotlib/" in path and record.getMessage().startswith("Matplotlib is building the font cache"):
            return False  # once per machine, when Keras 3's import pulls matplotlib in: not a warning to act on
        return record.levelno >= logging.WARNING or not any(p in path for p in ("/tensorflow/", "/tf_keras/", "/keras/", "/jax/", "/jaxlib/"))


class _PlainOwnLines(logging.Formatter):
    """Our own INFO lines as plain text, like the printed ones around them, and our own warnings as
    `warning: ...`; absl formats both in glog form (`W1130 17:18:07.598663 140367850367872 convert.py:211] ...`),
    which a user reads as TensorFlow's. Everything else keeps absl's form, which says where it came from."""

    def __init__(self, fallback: logging.Formatter) -> None:
        super().__init__()
        self.fallback = fallback

    def format(self, record: logging.LogRecord) -> str:
        if "/tpu_pipeline/" in record.pathname.replace(os.sep, "/"):
            if record.levelno == logging.INFO:
                return record.getMessage()
            if record.levelno == logging.WARNING:
                return f"warning: {record.getMessage()}"
        return self.fallback.format(record)


def _command_help(name: str, full: bool = False) -> str:
    """The command's own flags first (absl lists its own and TensorFlow's first, 100+ lines); with
    --helpfull, every other flag after them."""
    module = importlib.import_module(COMMANDS[name][0])
    lines = [f"usage: tpu-pipeline {name} [--config FILE ...] [--flags] [key=value ...]", "",
             (module.__doc__ or COMMANDS[name][1]).strip(), "", "flags:"]
    by_module = flags.FLAGS.flags_by_module_dict()
    # Under `python -m tpu_pipeline.cli`, absl files this module's flags under its path.
    ours = [m for m in by_module if m.startswith("tpu_pipeline") or "tpu_pipeline/" in m.replace(os.sep, "/")]
    for module_name in sorted(ours, key=lambda m: (m != COMMANDS[name][0], m)):
        lines.append(flags.FLAGS.module_help(module_name))
    lines += ["", "Any config key is a key=value argument (e.g. train.epochs=3); `tpu-pipeline config` prints them all."]
    if full:
        others = [m for m in by_module if m not in ours]
        lines += ["", "other flags (absl, TensorFlow):"] + [flags.FLAGS.module_help(m) for m in sorted(others)]
    else:
        lines.append("--helpfull adds the absl and TensorFlow flags.")
    return "\n".join(lines)


def _unknown_flag(args: Sequence[str]) -> str | None:
    """One line for the first flag absl does not know (absl's own error is a page of help), with the
    config key it most likely meant: `--epochs 3` → `train.epochs=3`."""
    from tpu_pipeline.config.loader import suggest_config_key

    app.define_help_flags()  # --help, --helpfull, ...: app.run would define them only later
    known = flags.FLAGS
    parser_flags = ("flagfile", "undefok")  # handled by absl's parser itself
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-":
            continue
        name, has_value, value = arg.lstrip("-").partition("=")
        if name in parser_flags:
            index += 0 if has_value else 1
            continue
        if name in known or (name.startswith("no") and name[2:] in known and known[name[2:]].boolean):
            if name in known and not known[name].boolean and not has_value:
                index += 1  # its value
            continue
        if not has_value and index < len(args) and not args[index].startswith("-") and "=" not in args[index]:
            value = args[index]
        suggestion = suggest_config_key(name, value if (has_value or value) else None)
        if suggestion:
            return f"unknown flag {arg.split('=')[0]}; config keys are key=value arguments: {suggestion}"
        return f"unknown flag {arg.split('=')[0]}; `tpu-pipeline COMMAND --helpfull` lists the flags"
    return None


INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C
NOTHING_KEPT = "nothing was written (this command writes its results only when it finishes)"


def interrupted_line(name: str, module: Any = None) -> str:
    """The one line a Ctrl-C prints: what the command kept, from its module's `interrupted()`
    (train: the last checkpoint; convert: the finished shards), else that nothing was written."""
    kept = None
    report = getattr(module, "interrupted", None)
    if report is not None:
        try:
            kept = report()
        except Exception as error:  # the line must come out whatever state the command was left in
            kept = f"(could not tell what was kept: {error})"
    return f"tpu-pipeline {name}: interrupted (Ctrl-C): {kept or NOTHING_KEPT}"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    name = argv[1] if len(argv) > 1 else "?"
    try:
        _main(argv)
    except KeyboardInterrupt:  # before the command ran (start-up: TensorFlow's import takes seconds)
        print(f"tpu-pipeline {name}: interrupted (Ctrl-C) while starting: {NOTHING_KEPT}", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)


def _main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(_usage())
        sys.exit(0 if len(argv) >= 2 else 2)
    name = argv.pop(1)
    if name not in COMMANDS:
        print(f"tpu-pipeline: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        sys.exit(2)
    verbose = _USER_SET_TF_LOG_LEVEL or any(arg.startswith(("--verbosity", "-v=")) or arg == "-v" for arg in argv)
    with native_stderr_silenced(not verbose):  # TF's C++ start-up lines, unless asked for
        command = importlib.import_module(COMMANDS[name][0]).run
        import tensorflow as tf

        tf.config.list_physical_devices()  # platform start-up (CUDA probing) happens here, silenced
    tf.get_logger().setLevel("WARNING")  # TF's own INFO lines (checkpoint sharding, ...) drown ours
    if any(arg in ("-h", "-?", "--help", "--helpshort", "--helpfull") for arg in argv[1:]):
        print(_command_help(name, full="--helpfull" in argv[1:]))
        sys.exit(0)
    unknown = _unknown_flag(argv[1:])
    if unknown is not None:
        print(f"tpu-pipeline {name}: error: {unknown}", file=sys.stderr)
        sys.exit(2)

    def run(args: Sequence[str]) -> None:
        handler = absl_logging.get_absl_handler()
        handler.setFormatter(_PlainOwnLines(handler.python_handler.formatter))
        if not verbose:
            handler.addFilter(_OthersInfoFilter())
        try:
            sys.exit(command(list(args[1:])))
        except TpuPipelineError as error:
            print(f"tpu-pipeline {name}: error: {error}", file=sys.stderr)
            if isinstance(error, PeerFailure):  # see PeerFailure: TF's exit would wait for the dead peer
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(2)
            sys.exit(2)
        except KeyboardInterrupt:
            sys.stdout.flush()
            print(interrupted_line(name, sys.modules.get(COMMANDS[name][0])), file=sys.stderr)
            sys.exit(INTERRUPTED_EXIT)

    app.run(run, argv=[f"tpu-pipeline {name}"] + argv[1:])


if __name__ == "__main__":
    main()
