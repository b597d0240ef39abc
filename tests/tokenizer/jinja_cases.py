#!/usr/bin/env python3
"""Check the expected outputs of tests/unit/test_jinja.c against python3-jinja2
(configured as transformers configures it): reads the cases from
`test_jinja --dump` on stdin.  Cases expecting "ERR:" / "PARSE:" must raise in
jinja2 too; the sandbox-limit cases are skipped (jinja2's sandbox has its own:
MAX_RANGE, an undefined for attributes it refuses).  Exit 0 when every case agrees, 1 otherwise."""
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from jinja_oracle import hf_env  # noqa: E402

env = hf_env()
bad = n = 0
for line in sys.stdin:
    c = json.loads(line)
    n += 1
    if c["want"].startswith("ERR:") and ("range(" in c["src"] or "__" in c["src"]):
        continue  # a sandbox limit of rlpipe's (jinja2's sandbox: MAX_RANGE, undefined)
    if "{% generation %}" in c["src"]:
        continue  # transformers' own tag, not jinja2's
    try:
        got = env.from_string(c["src"]).render(**json.loads(c["ctx"]))
    except Exception as e:
        got = "error: " + type(e).__name__
    want = c["want"]
    if want.startswith(("ERR:", "PARSE:")):
        ok = got.startswith("error")
    else:
        ok = got == want
    if not ok:
        bad += 1
        print(f"DIFFER: {c['src']!r}\n  jinja2: {got!r}\n  test:   {want!r}")
print(f"jinja_cases: {'ok' if not bad else 'FAIL'} ({n} cases, {bad} differ)")
sys.exit(1 if bad else 0)
