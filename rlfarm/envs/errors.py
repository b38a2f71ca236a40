"""The one error of the env layer (PURE): an env that cannot be made, or spaces rlfarm cannot act in."""


class EnvError(ValueError):
    """An env id that cannot be made, or spaces rlfarm cannot act in."""
