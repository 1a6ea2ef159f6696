"""The keys a pipeline's elements carry beside the data's own features: named once, read everywhere.

A feature dict may hold, besides the features the config names:

- `RECORDS_KEY`, `SOURCE_KEY`: a mixture's serialized records and each one's source index (before the
  parse: `{RECORDS_KEY: records, SOURCE_KEY: sources}`; after it, `SOURCE_KEY` beside the features, up to
  the outputs: `mixed_records`);
- `<key>` + `MASK_SUFFIX` (pad, bucket: 1 on real tokens) or `<key>` + `SEGMENT_SUFFIX` (pack: 1, 2, ...
  per example, 0 on padding) beside each token key: padding is marked apart from the tokens, since token
  id 0 is a real token;
- `EXAMPLE_MASK` (bucket: 1 for a real example, 0 for one that fills a bucket's last batch; an empty
  example is real), which evaluation weighs and token counting reads;
- the resume position's keys (`resume_position.POSITION_KEYS`), on a windowed pipeline's outputs.

`config.data.EXAMPLE_MASK` names the same key for the config layer, which imports no pipeline module.
"""
from __future__ import annotations

RECORDS_KEY = "_records"  # a mixed element's serialized records
SOURCE_KEY = "_source"  # each mixed example's source: its index in data.mixture.sources

MASK_SUFFIX = "_mask"  # pad, bucket: 1 on real tokens
SEGMENT_SUFFIX = "_segment_ids"  # pack: 1, 2, ... per example, 0 on padding
EXAMPLE_MASK = "example_mask"  # bucket: 1 on real examples (not a token key's mask)
