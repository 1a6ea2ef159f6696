"""sequences: variable-length tokens into static shapes: the modes (modes/), pad, bucket and pack stages, chunking,
packing and placement, and token counting. Imports stages/, sources/ and core/ only."""
