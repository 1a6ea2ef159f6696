"""mixtures: several sources at set rates: the schedule, the mixture source, per-source parses, token weights, the
length check, the share meter and reweighting on resume. Imports sequences/, stages/, sources/ and core/."""
