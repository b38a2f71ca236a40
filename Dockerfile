# rlfarm image for docker-compose.yml: worker, trainer and flower all run from it (CPU only).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the CPU index: PyPI's default Linux wheel pulls gigabytes of CUDA libraries that
# workers never use. Its own layer, so code changes do not re-download it. `pip install` below
# then finds torch==2.13.0 satisfied (the +cpu local version matches the pin).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY pyproject.toml setup.cfg README.md cli.py ./
COPY rlfarm ./rlfarm
COPY tasks ./tasks
# `all`: the trainer's extras (TensorBoard, matplotlib) and Flower, since the three services share
# this image (a worker-only image would be `pip install .`).
RUN pip install ".[all]" && pip check

# Run as an unprivileged user. /runs belongs to it so that the named volume mounted there (which
# Docker seeds from the image's directory) is writable by the trainer.
RUN useradd --create-home --uid 10001 rlfarm && mkdir /runs && chown rlfarm:rlfarm /runs
USER rlfarm

# No secrets here: RLFARM_REDIS_URL and FLOWER_BASIC_AUTH come from the environment at run time.
CMD ["rlfarm", "--help"]
