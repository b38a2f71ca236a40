"""The config layer's one error."""


class ConfigError(ValueError):
    """A preset, override or value that cannot make a valid run."""
