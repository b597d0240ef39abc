#!/bin/sh
# bench/grpo-step-gpu.sh — the whole GRPO step on one GPU for the GPT-2 124M
# shape (issue 11's figure): 64 prompts x 8 samples, 64-token prompts, up to
# 256 new tokens, through `rl-rollout | rl-reward | rl-train`, all on cuda,
# on-policy (--max-staleness 0: the generator waits for each new version).
# A step is generation + scoring + log-probs + update + weight sync: by
# default through rl-sync on this host (WEIGHTS=sync: versions pushed from
# memory with --ckpt-every, fetched over shared memory), WEIGHTS=dir: a
# checkpoint directory written every step that the generator loads, or
# WEIGHTS=group: the weights broadcast group on 127.0.0.1 (CUDA IPC, device
# to device; docs/wgroup.md), a step directory only at the end.  Random weights and
# the byte tokenizer (no weights can be downloaded): the sampled text is
# noise, which changes nothing in the cost (lengths are recorded).
# STALENESS=1 lets the generator run one version ahead (rl-rollout
# --max-staleness 1: batch k + 1 is generated while step k trains, both
# processes on the one GPU), the asynchronous wiring's overlap through pipes;
# 0 (default) is on-policy.
# JSON lines on stdout: one per trainer step and a summary over the steps
# after the first (warm-up): mean_step_s and samples_per_s over those steps,
# and steady_samples_per_s without the last one, whose publish writes the final
# step directory (once per run, not per step).  Env: STEPS (default 4), PROMPTS
# (64), N (8), PLEN (64), GEN (256), MICRO (token budget per micro-batch,
# 16384), DEVICE (cuda), WEIGHTS (sync), STALENESS (0), KEEP=1 keeps the work
# directory.
set -eu
STEPS=${STEPS:-4} PROMPTS=${PROMPTS:-64} N=${N:-8} PLEN=${PLEN:-64} GEN=${GEN:-256}
MICRO=${MICRO:-16384} DEVICE=${DEVICE:-cuda} WEIGHTS=${WEIGHTS:-sync} STALENESS=${STALENESS:-0}
D=$(mktemp -d "${TMPDIR:-/tmp}/grpo-step.XXXXXX")
SPID=
cleanup() { [ -z "$SPID" ] || kill "$SPID" 2>/dev/null; [ "${KEEP:-0}" = 1 ] || rm -rf "$D"; }
trap cleanup EXIT
cat > "$D/cfg.json" <<JSON
{"model_type":"gpt2","vocab_size":50257,"n_embd":768,"n_layer":12,"n_head":12,"n_positions":1024,
 "torch_dtype":"bfloat16"}
JSON
rl-train -q --init "$D/cfg.json" --tokenizer bytes --out "$D/m0" --seed 1
awk -v n=$((PROMPTS * (STEPS + 1))) -v l="$PLEN" 'BEGIN { srand(1); for (i = 0; i < n; i++) {
	s = ""; for (j = 0; j < l; j++) s = s sprintf("%c", 97 + int(rand() * 26)); printf "{\"prompt\":\"%s\"}\n", s } }' \
	> "$D/p.jsonl"
if [ "$WEIGHTS" = sync ]; then
	URL="ipc://$D/sync"
	rl-sync serve -q --listen "$URL" 2> "$D/sync.err" &
	SPID=$!
	for _ in $(seq 100); do rl-sync status "$URL" --timeout 200 > /dev/null 2>&1 && break; sleep 0.1; done
	GEN_W="--sync $URL" TRAIN_W="--sync $URL --ckpt-every 1000000"
elif [ "$WEIGHTS" = group ]; then
	A=127.0.0.1:$((20000 + $$ % 20000))
	GEN_W="--weights-group $A --weights-group-rank 1 --weights-group-size 2"
	TRAIN_W="--weights-group $A --weights-group-size 2 --ckpt-every 1000000"
else
	GEN_W="--weights-from $D/ck" TRAIN_W=
fi
t0=$(date +%s.%N)
rl-rollout -q -m "$D/m0" --device "$DEVICE" $GEN_W --max-staleness "$STALENESS" --train-batch "$PROMPTS" \
	-n "$N" --slots $((PROMPTS * N)) --kv-mem 16G --max-tokens "$GEN" --seed 1 --weights-timeout 300 "$D/p.jsonl" \
	2> "$D/gen.err" |
	rl-reward -q --task 'format:^[a-z]' 2> "$D/reward.err" |
	rl-train -q -m "$D/m0" --out "$D/ck" --algo grpo --device "$DEVICE" --batch "$PROMPTS" --max-steps "$STEPS" $TRAIN_W \
	    --max-tokens-per-micro "$MICRO" --keep 2 --metrics "$D/m.jsonl" 2> "$D/train.err" || true
t1=$(date +%s.%N)
for f in gen reward train; do [ -s "$D/$f.err" ] && sed "s/^/$f: /" "$D/$f.err" | tail -5 >&2; done
[ -s "$D/m.jsonl" ] || { echo "grpo-step: no metrics (see the messages above)" >&2; exit 1; }
awk -v w="$WEIGHTS" -v st="$STALENESS" -v t0="$t0" -v t1="$t1" -v p="$PROMPTS" -v n="$N" -v plen="$PLEN" -v gen="$GEN" '
function num(k,   r) { if (match($0, "\"" k "\":[-0-9.e+]+")) { r = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return r + 0 } return -1 }
{
	step = num("step"); ts = num("timing_s/step"); tg = num("timing_s/gen"); tu = num("timing_s/update_actor")
	tp = num("timing_s/publish"); len = num("response_length/mean"); tot = ts  # timing_s/step includes the wait
	printf "{\"bench\":\"grpo_step_gpu\",\"step\":%d,\"gen_wait_s\":%.3f,\"update_s\":%.3f,\"publish_s\":%.3f,\"step_s\":%.3f,\"response_length\":%.1f,\"samples_per_s\":%.1f}\n", step, tg, tu, tp, tot, len, p * n / tot
	if (NR > 1) { sum += tot; k++; last = tot }
}
END {
	if (!k) exit
	steady = k > 1 ? p * n * (k - 1) / (sum - last) : 0
	printf "{\"bench\":\"grpo_step_gpu\",\"model\":\"gpt2-124M\",\"weights\":\"%s\",\"staleness\":%d,", w, st
	printf "\"prompts\":%d,\"samples\":%d,\"prompt_tokens\":%d,\"max_new\":%d,\"steps_timed\":%d,\"mean_step_s\":%.3f,\"samples_per_s\":%.1f,\"steady_samples_per_s\":%.1f,\"wall_s\":%.1f}\n", p, n, plen, gen, k, sum / k, p * n * k / sum, steady, t1 - t0
}' "$D/m.jsonl"
