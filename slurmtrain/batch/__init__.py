"""The batch shell: the supervisor that runs after each srun step and decides what happens next."""
