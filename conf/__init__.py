# Hydra config groups, shipped in the wheel as the package `slurmtrain.conf` (pyproject.toml package-dir).
