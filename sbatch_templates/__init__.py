# The batch script template, shipped in the wheel as `slurmtrain.sbatch_templates` (pyproject.toml package-dir).
