"""`tpu-pipeline COMMAND [--flags] [key=value ...]`: one absl app with subcommands.

Positional `key=value` arguments override any config key (e.g. `data.batch_size=256`).
A TpuPipelineError is printed as one clear message (exit 2), never as a stack trace.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Sequence

_USER_SET_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL" in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import logging  # noqa: E402

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from tpu_pipeline.errors import TpuPipelineError  # noqa: E402
from tpu_pipeline.system import native_stderr_silenced  # noqa: E402

flags.DEFINE_string("config", None, "YAML config file (local or gs://). Without it, the built-in demo config.")

# name → (module, help). A command module is imported only when it runs, so each command
# defines only its own absl flags and a broken optional dependency breaks only its command.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tpu_pipeline.commands.demo", "build the demo input pipeline and print its throughput"),
    "train": ("tpu_pipeline.commands.train", "train and evaluate a model from a config (the main job)"),
    "convert": ("tpu_pipeline.commands.convert", "convert an image folder, CSV/NumPy or TFDS dataset to TFRecord shards"),
    "bench": ("tpu_pipeline.commands.bench", "measure one input pipeline: examples/s, CPU per example, ceilings"),
    "doctor": ("tpu_pipeline.commands.doctor", "measure each stage, name the bottleneck, propose a tuned config"),
    "verify": ("tpu_pipeline.commands.verify", "read every record once and list damaged or misfitting ones (exit 1 if any)"),
}


def _usage() -> str:
    lines = ["usage: tpu-pipeline COMMAND [--config FILE] [--flags] [key=value ...]", "", "commands:"]
    lines += [f"  {name:10s} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "Run `tpu-pipeline COMMAND --helpfull` for a command's flags."]
    return "\n".join(lines)


class _OthersInfoFilter(logging.Filter):
    """Drops INFO lines that TensorFlow and Keras log through absl (e.g. "Sharding callback duration"
    at every checkpoint); ours and every warning stay. `--verbosity` keeps them all."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace(os.sep, "/")
        return record.levelno >= logging.WARNING or not any(p in path for p in ("/tensorflow/", "/tf_keras/", "/keras/"))


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
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

    def run(args: Sequence[str]) -> None:
        if not verbose:
            absl_logging.get_absl_handler().addFilter(_OthersInfoFilter())
        try:
            sys.exit(command(list(args[1:])))
        except TpuPipelineError as error:
            print(f"tpu-pipeline {name}: error: {error}", file=sys.stderr)
            sys.exit(2)

    app.run(run, argv=[f"tpu-pipeline {name}"] + argv[1:])


if __name__ == "__main__":
    main()
