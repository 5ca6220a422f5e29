"""Model location and conversion.

Turn a name, path, hub id or GGUF file into an mlx-lm loadable directory.
"""
