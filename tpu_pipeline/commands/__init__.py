"""One module per `tpu-pipeline` subcommand; each exposes `run(overrides) -> exit code`."""
