"""Layer 0: what every layer may use and none owns: where caches live, files written whole,
the package version, the garbage collector paused for large passes."""
