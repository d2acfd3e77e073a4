"""Layer 5: the cost model, candidate extraction from the e-graph, and (later) schedule search."""
