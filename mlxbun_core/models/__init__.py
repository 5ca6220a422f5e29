"""Model location and conversion: turn a name, path, hub id or GGUF file into an mlx-lm loadable directory."""
