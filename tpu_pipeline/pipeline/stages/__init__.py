"""stages: dataset → dataset steps, one job a module (parse and map, shuffles, cache, repeat, batching, outputs,
prefetch, options, the service split, exact evaluation), their interface (base) and roles. Imports core/, sources/."""
