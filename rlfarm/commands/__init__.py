"""What the CLI's commands do beyond mapping flags: `rlfarm status` (status, its JSON schema
status.schema.json, the --watch loop in watch) and `rlfarm plot` (plot). Beside rlfarm.cli, above
everything they read: the farm, the run directory, the trainer's metrics."""
