"""The lowest I/O layer: the run directory written whole, one-line logs, the console's width and the
Prometheus exporter. It imports only the pure layers, so every I/O layer above (farm, worker, trainer,
the command) may use it."""
