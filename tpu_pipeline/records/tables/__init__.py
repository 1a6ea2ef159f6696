"""tables: Parquet and Arrow datasets as the Hugging Face hub and `datasets` lay them out, for `convert --from
parquet|hf` (records/table_input.py): which files make which split, reading them a piece at a time, which
rows go where in what order, and the columns encoded as records. Imports records' shared modules, format, errors."""
