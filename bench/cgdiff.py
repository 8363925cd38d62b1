#!/usr/bin/env python3
"""Inclusive instructions per request, function by function, from the two
callgrind files bench/profile.sh keeps for a variant (PROFILE_KEEP): the
shorter run's costs subtracted from the longer one's, over the difference
in transactions.

    python3 bench/cgdiff.py FEW.callgrind MANY.callgrind N [LIMIT]

N is the difference in requests (the NAME.requests file)."""
import re
import subprocess
import sys


def inclusive(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    costs = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        name = re.sub(r"^.*?:", "", m.group(2).split(" [")[0], count=1) if ":" in m.group(2) else m.group(2)
        name = name.split(" [")[0]
        costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


few, many, n = inclusive(sys.argv[1]), inclusive(sys.argv[2]), int(sys.argv[3])
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 60
total = (many.get("PROGRAM TOTALS", 0) - few.get("PROGRAM TOTALS", 0)) / n
rows = sorted(((many[k] - few.get(k, 0)) / n, k) for k in many)
rows.reverse()
print(f"{total:10.0f} 100.0%  per request")
for cost, name in rows[:limit]:
    if name == "PROGRAM TOTALS" or "0x0" in name:
        continue
    print(f"{cost:10.0f} {100 * cost / total:5.1f}%  {name}")
