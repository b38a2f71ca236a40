"""What a run shows as it trains, the trainer's observation sinks: its numbers (metrics: console, CSV,
TensorBoard, RunLogger), MLflow (tracking) and each evaluated version's episode on video (video).
Above evaluation and farm, below the trainer; the run directory and messages are rlfarm.runio."""
