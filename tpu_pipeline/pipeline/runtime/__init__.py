"""runtime: what runs beside a live pipeline: the resumable iterators, the position log for model.fit, the wait
meter and the stall probe. Imports checks/, mixtures/, sequences/, stages/, sources/ and core/."""
