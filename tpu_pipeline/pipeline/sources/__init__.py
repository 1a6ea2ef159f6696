"""sources: where records come from: the Source protocol and its read options, TFRecord files, arrays, a converted
dataset's folder, TFDS; file listing, counting and sharding between input pipelines. Imports only core/."""
