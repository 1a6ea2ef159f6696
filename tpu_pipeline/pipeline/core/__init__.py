"""core: what every room shares: the element keys, the resume position's encoding, the seed tree, tf.data tuning.
Imports no other room (only tpu_pipeline's lower layers: errors, system, format, config)."""
