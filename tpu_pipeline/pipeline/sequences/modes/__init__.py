"""modes: one module per data.sequence mode (pad, bucket, pack), each a `SequenceMode` (base), listed once in
registry.MODES. Imports sequences/, stages/, sources/ and core/ (never mixtures/ or higher)."""
