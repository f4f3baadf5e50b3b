"""Errors the user can fix: printed as one line, exit code 2, nothing started."""


class ConfigError(Exception):
    """A bad config value: the message names the key, the value and the fix."""


EXIT_CONFIG = 2
