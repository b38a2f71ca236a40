"""What a run shows and leaves behind: its messages (logs), numbers (metrics: console, CSV,
TensorBoard), the run directory written whole (rundir), `rlfarm status` and `rlfarm plot`."""
