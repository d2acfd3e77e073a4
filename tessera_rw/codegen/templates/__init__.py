"""Kernel templates: one per kernel kind (schedule space, resource model, CUDA emitter)."""
