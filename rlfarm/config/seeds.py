"""`rlfarm train --seeds 1-5` / `--seeds 1,2,7` / `--seeds 1-3,10`, PURE: the seed list it names."""

from __future__ import annotations

from rlfarm.config.errors import ConfigError


def parse_seeds(text: str) -> list[int]:
    """Seeds in the order given, each once: ranges `a-b` (inclusive) and single seeds, comma-separated."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not (low.isascii() and low.isdigit() and (not dash or (high.isascii() and high.isdigit()))):
            raise ConfigError(f"expected non-negative seeds and ranges like 1-5 or 1,2,3, got {text!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ConfigError(f"the range {part} runs backwards (write {last}-{first})")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    if len(seeds) < 2:
        raise ConfigError(f"expected at least two seeds (for one, use --seed), got {text!r}")
    return seeds
