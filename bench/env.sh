#!/bin/sh
# bench/env.sh — rl-rollout --env: multi-turn tokens/s against single-turn on
# the same total tokens, and with an environment that takes 50 ms a step
# against one that answers at once (64 concurrent episodes).  JSON lines.
#
#   sh bench/env.sh [EPISODES] [TURNS] [TOKENS_PER_TURN]   (default 64 8 16)
#
# The model: a random 4-layer Qwen2 (hidden 256, bytes tokenizer, no EOS in
# reach: the bytes tokenizer's EOS ends a turn early now and then, so tokens
# are counted from the output).  The environment is a shell loop (fast to
# start), observation "ok" (2 tokens) after each turn, done after TURNS turns.
# tokens/s counts every response token, sampled and inserted, per wall
# second of generation as rl-rollout reports it (from its first prompt line to
# its last record: the environments' start included, the model's load not).
# Run from the tree root (RL_BUILD: the build folder, default build).
set -eu
EP=${1:-64}; TURNS=${2:-8}; TPT=${3:-16}
BIN=${RL_BUILD:-build}/bin
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/cfg.json" <<JSON
{"model_type":"qwen2","vocab_size":261,"hidden_size":256,"num_hidden_layers":4,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":512,"max_position_embeddings":1024,"torch_dtype":"float32"}
JSON
"$BIN/rl-train" -q --init "$W/cfg.json" --tokenizer bytes --out "$W/m" --seed 1
cat > "$W/env.sh" <<'SH'
#!/bin/sh
n=0
while IFS= read -r req; do
	case $req in
	*'"op":"reset"'*) n=0; echo '{"observation": "", "done": false}' ;;
	*) n=$((n + 1)); [ "${LAT:-0}" = 0 ] || sleep "$LAT"
	   if [ "$n" -ge "$TURNS" ]; then echo '{"observation": "", "reward": 1, "done": true}'
	   else echo '{"observation": "ok", "done": false}'; fi ;;
	esac
done
SH
i=0; : > "$W/p.jsonl"
while [ $i -lt "$EP" ]; do echo "{\"prompt\":\"task $i:\"}" >> "$W/p.jsonl"; i=$((i + 1)); done
# one line: run NAME ARGS...: wall seconds and response tokens
run() {
	name=$1; shift
	"$BIN/rl-rollout" -m "$W/m" --slots "$EP" --kv-mem 512M --temperature 1 --jsonl "$@" "$W/p.jsonl" \
	    > "$W/out.jsonl" 2> "$W/err"
	python3 - "$W/out.jsonl" "$name" "$W/err" "$EP" "$TURNS" "$TPT" <<'PY'
import json, re, sys
f, name = sys.argv[1], sys.argv[2]
m = re.search(r"(\d+) tokens in ([0-9.]+) s", open(sys.argv[3]).read())
tok = samp = 0
for l in open(f):
    r = json.loads(l)
    tok += len(r["response"])
    samp += sum(r.get("loss_mask", [1] * len(r["response"])))
assert m and int(m.group(1)) == tok, (m and m.group(0), tok)
w = float(m.group(2))
print(json.dumps({"bench": "env", "case": name, "episodes": int(sys.argv[4]), "turns": int(sys.argv[5]),
                  "tokens_per_turn": int(sys.argv[6]), "tokens": tok, "sampled": samp, "wall_s": round(w, 2),
                  "tokens_s": round(tok / w, 1)}))
PY
}
TOTAL=$((TURNS * (TPT + 2) - 2))
run single --max-tokens "$TOTAL"
TURNS=$TURNS LAT=0 run multi_0ms --max-tokens "$TPT" --env "TURNS=$TURNS LAT=0 sh $W/env.sh"
TURNS=$TURNS LAT=0.05 run multi_50ms --max-tokens "$TPT" --env "TURNS=$TURNS LAT=0.05 sh $W/env.sh" --env-timeout 10
