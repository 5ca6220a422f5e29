"""The local model library: what is on disk (scan), and what fits this machine (fit)."""
