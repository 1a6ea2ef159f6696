"""`tpu-pipeline COMMAND [--flags] [key=value ...]`: one absl app with subcommands.

Positional `key=value` arguments override any config key (e.g. `data.batch_size=256`).
A TpuPipelineError is printed as one clear message (exit 2), never as a stack trace.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from absl import app, flags  # noqa: E402

from tpu_pipeline.errors import TpuPipelineError  # noqa: E402

flags.DEFINE_string("config", None, "YAML config file (local or gs://). Without it, the built-in demo config.")

Command = Callable[[Sequence[str]], int]


def _commands() -> dict[str, tuple[str, Command]]:
    from tpu_pipeline.commands import demo

    return {
        "demo": ("build the demo input pipeline and print its throughput", demo.run),
    }


def _usage(commands: dict[str, tuple[str, Command]]) -> str:
    lines = ["usage: tpu-pipeline COMMAND [--config FILE] [--flags] [key=value ...]", "", "commands:"]
    lines += [f"  {name:10s} {help_text}" for name, (help_text, _) in commands.items()]
    lines += ["", "Run `tpu-pipeline COMMAND --helpfull` for a command's flags."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    commands = _commands()
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(_usage(commands))
        sys.exit(0 if len(argv) >= 2 else 2)
    name = argv.pop(1)
    if name not in commands:
        print(f"tpu-pipeline: unknown command {name!r}\n\n{_usage(commands)}", file=sys.stderr)
        sys.exit(2)
    _, command = commands[name]

    def run(args: Sequence[str]) -> None:
        try:
            sys.exit(command(list(args[1:])))
        except TpuPipelineError as error:
            print(f"tpu-pipeline {name}: error: {error}", file=sys.stderr)
            sys.exit(2)

    app.run(run, argv=[f"tpu-pipeline {name}"] + argv[1:])


if __name__ == "__main__":
    main()
