"""Layer 4: target architectures, kernel templates (schedule space, resource model, CUDA emitter),
NVRTC compilation with ptxas facts."""
