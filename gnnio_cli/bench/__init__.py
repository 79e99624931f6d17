"""Measuring: timing with CUDA events, peak memory, the byte floor, reports."""
