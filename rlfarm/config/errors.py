"""The config layer's errors."""


class ConfigError(ValueError):
    """A preset, override or value that cannot make a valid run."""


class MissingPackage(ConfigError):
    """A setting that needs a package this machine has not installed (moviepy for --capture-video,
    MLflow for --track): the run cannot start here, though nothing typed was wrong (exit 1, not 2)."""
