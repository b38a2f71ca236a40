"""The score per module of a mutation run (scripts/mutation.sh): `mutmut results --all true` on stdin,
the mutant name patterns of the guards run as arguments. Killed counts timeouts and crashes too."""

import fnmatch
import sys
from collections import Counter, defaultdict


def main() -> None:
    patterns = sys.argv[1:]
    by_module: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for line in sys.stdin:
        name, _, status = line.strip().rpartition(": ")
        if name and any(fnmatch.fnmatch(name, p) for p in patterns):
            by_module[name.split(".x_")[0].split(".xǁ")[0]][status] += 1
    print(f"{'module':32} {'killed':>8} {'mutants':>8} {'score':>7} {'survived':>9} {'no tests':>9}")
    for module, counts in sorted(by_module.items()):
        total = sum(counts.values())
        killed = counts["killed"] + counts["timeout"] + counts["segfault"]
        print(f"{module:32} {killed:8} {total:8} {killed / total:7.0%} {counts['survived']:9} {counts['no tests']:9}")


if __name__ == "__main__":
    main()
