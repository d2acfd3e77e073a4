"""Layer 3: a chosen Graph lowered to a KernelPlan — kernels in order over reused dense buffers."""
