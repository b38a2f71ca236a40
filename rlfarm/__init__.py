"""rlfarm: a reinforcement-learning rollout farm on Celery and Redis.

`rlfarm.train(...)` trains from Python (see rlfarm.api); `rlfarm train` does the same from a shell.
`rlfarm.load(path)` reads a saved policy file as a model with `predict(obs)` (rlfarm.evaluation.loaded).
"""

from rlfarm.core.protocol import RELEASE as __version__  # low, so that workers report it without the face

__all__ = ["LogStep", "LoadedPolicy", "PolicyFileError", "TrainResult", "load", "train"]


def __getattr__(name: str):
    # Lazy: `import rlfarm.config` (workers, the CLI's --help) must not pay for torch and the trainer.
    if name == "train":
        from rlfarm.api import train

        return train
    if name == "PolicyFileError":
        from rlfarm.errors import PolicyFileError

        return PolicyFileError
    if name in ("load", "LoadedPolicy"):
        from rlfarm.evaluation import loaded

        return getattr(loaded, name)
    if name in ("LogStep", "TrainResult"):
        from rlfarm import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rlfarm' has no attribute {name!r}")
