"""Long work as jobs: a SQLite row and event log per job (``store``), run in a
subprocess (``runner``) by the server or in the foreground by the CLI: LoRA
fine-tuning (``finetune``) and quantization (``quantize``) through mlx-lm."""
