#!/usr/bin/env python3
# extract.py — turns an rl-train metrics file (JSONL, rl-metrics(5)) into a
# whitespace-separated table for gnuplot: a header line "# step KEY...",
# then one row per step; a key absent or null in a step is NaN.  A key with
# no value in any step is left out of the table (with a warning), so every
# column has something to draw.
#
# usage: extract.py METRICS.jsonl KEY... > table.dat
# A line that is not a JSON object is an error naming the file and line
# (exit 1); blank lines are skipped.  The x column is "step" when present,
# the line's position otherwise.
import json
import math
import sys


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: extract.py METRICS.jsonl KEY...\n")
        return 2
    path, keys = argv[1], argv[2:]
    try:
        f = sys.stdin if path == "-" else open(path, encoding="utf-8")
    except OSError as e:
        sys.stderr.write("extract.py: cannot open '%s': %s\n" % (path, e.strerror))
        return 1
    rows, table = 0, []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
            except ValueError as e:
                sys.stderr.write("extract.py: '%s' line %d: not JSON: %s\n" % (path, n, e))
                return 1
            if not isinstance(o, dict):
                sys.stderr.write("extract.py: '%s' line %d: not a JSON object\n" % (path, n))
                return 1
            step = o.get("step", rows + 1)
            cells = []
            for v in [step] + [o.get(k) for k in keys]:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    cells.append("NaN")
                else:
                    cells.append(repr(v))
            table.append(cells)
            rows += 1
    if rows == 0:
        sys.stderr.write("extract.py: '%s' has no metrics lines\n" % path)
        return 1
    keep = [0]
    for i, k in enumerate(keys, 1):
        if any(r[i] != "NaN" for r in table):
            keep.append(i)
        else:
            sys.stderr.write("extract.py: '%s': no values of '%s'; left out\n" % (path, k))
    if len(keep) == 1:
        sys.stderr.write("extract.py: '%s': none of the keys has a value\n" % path)
        return 1
    out = ["# step " + " ".join(keys[i - 1] for i in keep[1:])]
    out += [" ".join(r[i] for i in keep) for r in table]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
