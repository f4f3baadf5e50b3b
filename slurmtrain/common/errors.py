"""Errors the user can fix, and the exit codes every world agrees on.

A ConfigError is printed as one line, exit code 2, nothing started. The job step's exit codes tell
the batch shell what happened (it can always run scontrol, even when the job runs in a container).
"""


class ConfigError(Exception):
    """A bad config value: the message names the key, the value and the fix."""


EXIT_CONFIG = (
    2  # bad config (login) / the run directory's config cannot run (compute): never requeue
)
EXIT_REQUEUE = 3  # time limit: everything saved, requeue me
EXIT_BAD_NODE = 4  # the health gate failed a node: exclude it and requeue
EXIT_HANG = 5  # the watchdog saw no progress: stacks dumped, requeue
EXIT_TERMINATED = 6  # SIGTERM, saved: preempted (restart) or cancelled (stop); Slurm tells which
EXIT_DUPLICATE = 7  # another live job owns the run: this one exits untouched; never restart it
EXIT_RELAUNCH = 8  # supervisor -> batch shell: start the next attempt in this allocation
