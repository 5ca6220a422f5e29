"""How tokens are made: sampling parameters, the text pipeline, the model worker."""
