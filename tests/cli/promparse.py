"""promparse.py — a strict parser of the Prometheus text exposition format
(0.0.4) for the tests: HELP and TYPE at most once per family and before its
samples, samples of a family together, names and labels by the grammar,
counters ending in _total and not negative, no duplicate series.

  parse(text) -> (types, samples): {family: type}, {"name{labels}": value}
"""
import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s)(?:,%s)*\})? (\S+)$" % (NAME, LABEL, LABEL))


def parse(text):
    lines = text.split("\n")
    assert lines[-1] == "", "the exposition ends with a newline"
    lines.pop()
    typed, helped, samples, order = {}, set(), {}, []
    for ln in lines:
        if ln.startswith("# HELP "):
            name = ln.split(" ")[2]
            assert re.fullmatch(NAME, name), ln
            assert name not in helped, "HELP twice: " + ln
            assert name not in typed, "HELP after TYPE: " + ln
            helped.add(name)
            continue
        if ln.startswith("# TYPE "):
            parts = ln.split(" ")
            assert len(parts) == 4 and re.fullmatch(NAME, parts[2]), ln
            assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"), ln
            assert parts[2] not in typed, "TYPE twice: " + ln
            typed[parts[2]] = parts[3]
            order.append(parts[2])
            continue
        assert not ln.startswith("#"), "stray comment: " + ln
        m = SAMPLE.match(ln)
        assert m, "not a sample line: %r" % ln
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        v = float(value)
        fam = name
        for suf in ("_bucket", "_sum", "_count"):
            base = name[: -len(suf)]
            if name.endswith(suf) and typed.get(base) == "histogram":
                fam = base
        assert fam in typed, "sample before its TYPE line: " + ln
        assert fam == order[-1], "samples of %s not grouped together" % fam
        if typed[fam] == "counter":
            assert name.endswith("_total") and v >= 0, ln
        key = name + labels
        assert key not in samples, "duplicate sample: " + ln
        samples[key] = v
    return typed, samples
