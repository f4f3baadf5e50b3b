"""`python -m slurmtrain.cli.doctor`: see slurmtrain.cli.doctor.main."""

from slurmtrain.cli.doctor import main

raise SystemExit(main())
