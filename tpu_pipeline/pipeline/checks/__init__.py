"""checks: is the data sound and does it fit a TPU: record framing and faults, bad-record repair, the feature spec,
empty sources, vocabularies, TPU shapes and dtypes. Imports mixtures/, sequences/, stages/, sources/ and core/."""
