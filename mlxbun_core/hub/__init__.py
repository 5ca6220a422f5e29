"""Getting and managing models: hub search and downloads, disk GC, settings, datasets
and pushes. Everything goes through ``huggingface_hub`` (cache layout, resume, tokens);
the server routes (:mod:`mlxbun_core.webapp.hub`) and the CLI (:mod:`.cli`) are
thin wrappers over the functions here."""
