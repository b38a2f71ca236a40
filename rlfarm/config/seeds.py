"""`rlfarm train --seeds 1-5` / `--seeds 1,2,7` / `--seeds 1-3,10`, PURE: the seed list it names, at
most MAX_SEEDS of them, and the list written back compactly (`compact_seeds`)."""

from __future__ import annotations

from rlfarm.errors import ConfigError
from rlfarm.sections.bounds import MAX_SEEDS

WHY = "each is a trainer process and a run directory"


def parse_seeds(text: str) -> list[int]:
    """Seeds in the order given, each once: ranges `a-b` (inclusive) and single seeds, comma-separated.
    More than MAX_SEEDS is refused before any range is expanded (`1-100000` builds no list)."""
    seeds: list[int] = []
    seen: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not (low.isascii() and low.isdigit() and (not dash or (high.isascii() and high.isdigit()))):
            raise ConfigError(f"expected non-negative seeds and ranges like 1-5 or 1,2,3, got {text!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ConfigError(f"the range {part} runs backwards (write {last}-{first})")
        if last - first + 1 > MAX_SEEDS:  # before the range is expanded
            raise ConfigError(
                f"the range {part} is {last - first + 1:,} seeds, more than the "
                f"{MAX_SEEDS:,} one command may train ({WHY})"
            )
        for s in range(first, last + 1):
            if s not in seen:
                seen.add(s)
                seeds.append(s)
        if len(seeds) > MAX_SEEDS:  # each range is bounded, so the list stays within 2 x MAX_SEEDS
            raise ConfigError(f"more than the {MAX_SEEDS:,} seeds one command may train ({WHY})")
    if len(seeds) < 2:
        raise ConfigError(f"expected at least two seeds (for one, use --seed), got {text!r}")
    return seeds


def compact_seeds(seeds: list[int]) -> str:
    """[1, 2, 3, 5, 8, 9] -> "1-3, 5, 8-9": runs of consecutive seeds as ranges, in the order given, so
    `parse_seeds(compact_seeds(s)) == s` for any list parse_seeds returns (a 100-seed line, not 400 chars)."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ", ".join(parts)
