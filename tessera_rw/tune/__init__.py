"""Layer 5: the cost model, candidate extraction from the e-graph, schedule spaces and search, measurement,
and the persistent autotune cache."""
