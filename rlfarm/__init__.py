"""rlfarm: a reinforcement-learning rollout farm on Celery and Redis."""

__version__ = "0.1.0"
