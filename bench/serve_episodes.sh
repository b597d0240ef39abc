#!/bin/sh
# bench/serve_episodes.sh — issue 30's speed figure: `rl-rollout serve` under
# EPISODES concurrent clients each driving a multi-turn episode
# (bench/serve_episodes.js: streamed completions with X-Episode-Id, the
# answer and the observation "ok" appended each turn, the reward at the end)
# against `rl-rollout --env` generating the same episodes (the same model,
# slots, turns, tokens per turn and observation; plain framing), with the
# episodes' KV caches kept between calls and with --no-kv-reuse; then the
# latency of one-token calls on the idle server (per-request overhead).
#
#   sh bench/serve_episodes.sh [EPISODES] [TURNS] [TOKENS_PER_TURN]  (default 64 8 16)
#
# JSON lines {"bench":"serve-episodes","case":...}: sampled tokens per wall
# second (serve: first call to last reward, as the client sees it; --env:
# rl-rollout's own generation time, model load excluded), and the CPU seconds
# of the generating process(es): the server's (from /proc) and the client's,
# or rl-rollout's with its environment shells (getrusage of children).
# The model is bench/env.sh's: a random 4-layer Qwen2, hidden 256, bytes
# tokenizer, on the cpu.  Run from the tree root (RL_BUILD: the build folder).
set -eu
EP=${1:-64}; TURNS=${2:-8}; TPT=${3:-16}
BIN=$PWD/${RL_BUILD:-build}/bin
W=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$W"' EXIT
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
	*) n=$((n + 1))
	   if [ "$n" -ge "$TURNS" ]; then echo '{"observation": "", "reward": 1, "done": true}'
	   else echo '{"observation": "ok", "done": false}'; fi ;;
	esac
done
SH
i=0; : > "$W/p.jsonl"
while [ $i -lt "$EP" ]; do echo "{\"prompt\":\"task $i:\"}" >> "$W/p.jsonl"; i=$((i + 1)); done

env_case() {
	python3 - "$BIN/rl-rollout" "$W" "$EP" "$TURNS" "$TPT" <<'PY'
import json, re, resource, subprocess, sys
exe, w, ep, turns, tpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(f"{w}/env.jsonl", "w") as out, open(f"{w}/env.err", "w") as err:
    subprocess.run([exe, "-m", f"{w}/m", "--slots", str(ep), "--kv-mem", "512M", "--temperature", "1",
                    "--jsonl", "--max-tokens", str(tpt), "--env", f"TURNS={turns} sh {w}/env.sh", f"{w}/p.jsonl"],
                   stdout=out, stderr=err, check=True)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
m = re.search(r"(\d+) tokens in ([0-9.]+) s", open(f"{w}/env.err").read())
samp = sum(sum(json.loads(l)["loss_mask"]) for l in open(f"{w}/env.jsonl"))
wall = float(m.group(2))
print(json.dumps({"bench": "serve-episodes", "case": "env", "episodes": ep, "turns": turns, "tokens_per_turn": tpt,
                  "sampled": samp, "wall_s": round(wall, 2), "sampled_s": round(samp / wall, 1),
                  "cpu_s": round(ru.ru_utime + ru.ru_stime, 1)}))
PY
}

serve_case() {
	name=$1; shift
	port=$((20000 + ($$ + ${#name}) % 10000))
	"$BIN/rl-rollout" serve -q -m "$W/m" --listen "127.0.0.1:$port" --slots "$EP" --kv-mem 512M \
	    --max-tokens "$TPT" --device cpu --jsonl -o "$W/serve.jsonl" "$@" &
	pid=$!
	for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.05; done
	c0=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
	out=$(node bench/serve_episodes.js "http://127.0.0.1:$port" m "$EP" "$TURNS" "$TPT")
	c1=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
	fwd=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "rlserve_prompt_tokens_forwarded_total" { print $2 }')
	reu=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "rlserve_prompt_tokens_reused_total" { print $2 }')
	mis=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "rlserve_episode_mismatch_total" { print $2 }')
	# per-request overhead: one-token calls, one at a time, on the idle server
	lat=$(python3 - "$port" <<'PY'
import http.client, json, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
ts = []
for i in range(40):
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": "task 1:", "max_tokens": 1, "seed": i}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 200
    ts.append((time.perf_counter() - t0) * 1000)
ts.sort()
print(round(ts[len(ts) // 2], 2))
PY
)
	kill $pid; wait $pid 2>/dev/null || true; pid=
	python3 - "$name" "$out" "$c0" "$c1" "$(getconf CLK_TCK)" "$fwd" "$reu" "$mis" "$lat" "$W/serve.jsonl" <<'PY'
import json, sys
name, out = sys.argv[1], json.loads(sys.argv[2])
c0, c1, hz = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
samp = sum(sum(json.loads(l)["loss_mask"]) for l in open(sys.argv[10]))
assert samp == out["sampled"], (samp, out["sampled"])   # the records hold every sampled token
r = {"bench": "serve-episodes", "case": name, "episodes": out["clients"], "turns": out["turns"],
     "tokens_per_turn": out["tokens_per_turn"], "sampled": out["sampled"], "wall_s": out["wall_s"],
     "sampled_s": out["sampled_s"], "cpu_s": round((c1 - c0) / hz, 1), "client_cpu_s": out["client_cpu_s"],
     "ttft_p50_ms": out["ttft_p50_ms"], "ttft_p90_ms": out["ttft_p90_ms"],
     "latency_p50_ms": out["latency_p50_ms"], "latency_p90_ms": out["latency_p90_ms"],
     "prompt_forwarded": int(sys.argv[6]), "prompt_reused": int(sys.argv[7]), "mismatch": int(sys.argv[8]),
     "idle_1tok_call_ms": float(sys.argv[9])}
print(json.dumps(r))
PY
}

env_case
serve_case serve
serve_case serve_no_reuse --no-kv-reuse
