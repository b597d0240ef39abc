# field FILE ID EXPR: a Python expression on the record of id ID (r) of a
# JSONL file; a tuple prints space-separated
field() {
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("id") == int(sys.argv[2]):
        v = eval(sys.argv[3])
        print(*v) if isinstance(v, tuple) else print(v)' "$@"
}
