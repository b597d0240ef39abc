#!/bin/bash
# bench/soak.sh — the async queue wiring (rl-queue serve --data-dir, rl-rollout
# --queue, rl-reward --queue, rl-train --queue) with kill -9 of a random stage
# at a random moment, each restarted with the same options, then a count of
# every group: trained exactly once (the last checkpoint's groups_done holds N
# groups and global_step x batch = N), none lost, none twice; the broker's
# samples all done and none trained staler than --max-staleness.
#
#   bench/soak.sh [--seed S] [--kills K] [--prompts N] [--timeout S] [--keep]
#                 [--stale drop|regen] [--stages broker,gen,rew,train]
#
# --stale is the broker's (default regen); --stages the stages that may be
# killed (default all four).  With --stale drop no group may be dropped as
# stale: the gate keeps live groups fresh, so a drop is one a kill caused.
#
# Prints one JSON line (kills survived, groups checked); exit 1 with the seed
# on any failure.  Needs the rl-* programs on PATH.  tests/cli/soak.bats runs
# it CI-sized; longer runs are the benchmark (bench/RESULTS.md).
set -u
SEED=$RANDOM KILLS=6 N=40 TMO=120 KEEP=0 STALE=regen STAGES=broker,gen,rew,train
while [ $# -gt 0 ]; do
	case $1 in
	--seed) SEED=$2; shift ;;
	--kills) KILLS=$2; shift ;;
	--prompts) N=$2; shift ;;
	--timeout) TMO=$2; shift ;;
	--keep) KEEP=1 ;;
	--stale) STALE=$2; shift ;;
	--stages) STAGES=$2; shift ;;
	*) echo "usage: bench/soak.sh [--seed S] [--kills K] [--prompts N] [--timeout S] [--keep]" \
	        "[--stale drop|regen] [--stages broker,gen,rew,train]" >&2; exit 2 ;;
	esac
	shift
done
RANDOM=$SEED
case $STALE in drop|regen) ;; *) echo "soak: --stale: bad value '$STALE' (drop or regen)" >&2; exit 2 ;; esac
IFS=, read -r -a KILLABLE <<< "$STAGES"
for s in "${KILLABLE[@]}"; do
	case $s in broker|gen|rew|train) ;; *) echo "soak: --stages: bad stage '$s' (broker, gen, rew, train)" >&2; exit 2 ;; esac
done
BATCH=2 SAMPLES=2 K=2
[ $((N % BATCH)) -eq 0 ] || { echo "soak: --prompts must be a multiple of $BATCH" >&2; exit 2; }
STEPS=$((N / BATCH))
W=$(mktemp -d /tmp/rl-soak.XXXXXX)
declare -A PID
KILLED_BROKER=0 KILLED_GEN=0 KILLED_REW=0 KILLED_TRAIN=0

fail() {
	echo "soak: FAILED (seed $SEED, rerun with --seed $SEED): $*" >&2
	for f in "$W"/*.log; do echo "== $f" >&2; tail -5 "$f" >&2; done
	echo "== the broker" >&2; rl-queue stat --timeout 1 "$URL" 2>&1 | head -12 >&2
	echo "== the stages' kills: broker $KILLED_BROKER, generator $KILLED_GEN, reward $KILLED_REW, trainer $KILLED_TRAIN" >&2
	stop_all
	[ "$KEEP" = 1 ] || rm -rf "$W"
	exit 1
}

stop_all() {
	for s in feed train gen rew broker; do
		[ -n "${PID[$s]:-}" ] && kill -KILL "${PID[$s]}" 2>/dev/null
		[ -n "${PID[$s]:-}" ] && wait "${PID[$s]}" 2>/dev/null
		PID[$s]=""
	done
}
trap 'stop_all; exit 130' INT TERM

cat > "$W/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":64,"max_position_embeddings":32,"torch_dtype":"float32"}
JSON
rl-train -q --init "$W/cfg.json" --tokenizer bytes --out "$W/m0" --seed 1 || fail "rl-train --init"
for i in $(seq "$N"); do echo "{\"id\":$i,\"prompt\":\"x$i\"}"; done > "$W/p.jsonl"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="tcp://127.0.0.1:$PORT"

# each stage by its own pid (exec), its log appended across restarts
start() {
	case $1 in
	broker) (exec rl-queue serve ${SOAK_BROKER_V:--q} -l "$URL" --data-dir "$W/q" -k $K -b $BATCH --stale $STALE -t 1) \
	            2>>"$W/broker.log" & ;;
	gen) (exec rl-rollout -q -m "$W/m0" --queue "$URL" --weights-from "$W/ck" -n $SAMPLES --max-tokens 2 \
	            --seed 1 --broker-timeout 60) 2>>"$W/gen.log" & ;;
	rew) (exec rl-reward -q --queue "$URL" --task 'format:^[a-z]' --broker-timeout 60) 2>>"$W/rew.log" & ;;
	train) (exec rl-train -m "$W/m0" --out "$W/ck" --queue "$URL" --batch $BATCH --save-every 3 --lr 1e-2 \
	            --max-steps $STEPS --broker-timeout 60 --metrics "$W/metrics.jsonl") 2>>"$W/train.log" & ;;
	esac
	PID[$1]=$!
}

wait_broker() {
	for _ in $(seq 200); do rl-queue stat --timeout 0.2 "$URL" >/dev/null 2>&1 && return 0; sleep 0.05; done
	fail "the broker did not come up on $URL"
}

t0=$(date +%s.%N)
start broker
wait_broker
# the prompts come a step's worth every 50 ms (a run paced by its input, so
# that the kills fall all along it); each put is retried until the broker,
# maybe being restarted, takes it (a put again is dropped as duplicates)
(
	for ((i = 1; i <= N; i += BATCH)); do
		sed -n "${i},$((i + BATCH - 1))p" "$W/p.jsonl" > "$W/chunk.jsonl"
		until rl-queue put -q "$URL" "$W/chunk.jsonl" 2>/dev/null; do sleep 0.1; done
		sleep 0.05
	done
) &
PID[feed]=$!
start gen
start rew
start train

kills=0
while [ "$kills" -lt "$KILLS" ]; do
	# 0.2 to 1.2 s, then one of the stages that may be killed
	sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.2 + r / 32768 }')"
	kill -0 "${PID[train]}" 2>/dev/null || break   # the run is over
	s=${KILLABLE[$((RANDOM % ${#KILLABLE[@]}))]}
	kill -KILL "${PID[$s]}" 2>/dev/null
	wait "${PID[$s]}" 2>/dev/null
	if [ "$s" = train ] && grep -q "holds .* step directories .* but no full checkpoint" "$W/train.log"; then
		fail "the trainer cannot resume"
	fi
	start "$s"
	[ "$s" = broker ] && wait_broker
	kills=$((kills + 1))
	case $s in broker) KILLED_BROKER=$((KILLED_BROKER + 1)) ;; gen) KILLED_GEN=$((KILLED_GEN + 1)) ;;
	rew) KILLED_REW=$((KILLED_REW + 1)) ;; train) KILLED_TRAIN=$((KILLED_TRAIN + 1)) ;; esac
done

# the trainer ends at --max-steps (with its last full checkpoint)
end=$(($(date +%s) + TMO))
while kill -0 "${PID[train]}" 2>/dev/null; do
	[ "$(date +%s)" -lt "$end" ] || fail "the trainer did not reach step $STEPS within ${TMO}s"
	sleep 0.1
done
wait "${PID[train]}"; rc=$?
PID[train]=""
[ "$rc" -eq 0 ] || fail "rl-train exited $rc"
rl-queue stat --json "$URL" > "$W/stat.json" 2>/dev/null || fail "rl-queue stat"
t1=$(date +%s.%N)
stop_all

python3 - "$W/ck/latest/trainer_state.json" "$W/stat.json" "$N" "$BATCH" "$SAMPLES" "$K" <<'PY' || fail "the count"
import json, sys
st, stat, n, batch, samples, k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
s = json.load(open(st))
done = 0
for r in s["groups_done"]:
    lo, _, hi = r.partition("-")
    done += int(hi or lo) - int(lo) + 1
assert s["global_step"] * batch == n, "global_step %d x batch %d != %d groups" % (s["global_step"], batch, n)
assert done == n, "groups_done holds %d groups, not %d" % (done, n)
q = json.load(open(stat))
t = q["total"]
assert t["done"] == n * samples, "the broker counts %d samples done, not %d" % (t["done"], n * samples)
assert sum(q["staleness"][k + 1:]) == 0, "samples trained staler than K=%d: %s" % (k, q["staleness"])
assert t["stale_dropped"] == 0, "%d samples dropped as stale" % t["stale_dropped"]
PY
printf '{"bench":"soak","seed":%s,"stale":"%s","kills":%d,"broker":%d,"generator":%d,"reward":%d,"trainer":%d,"groups_checked":%d,"samples_checked":%d,"steps":%d,"wall_s":%.1f}\n' \
	"$SEED" "$STALE" "$kills" "$KILLED_BROKER" "$KILLED_GEN" "$KILLED_REW" "$KILLED_TRAIN" "$N" $((N * SAMPLES)) "$STEPS" \
	"$(echo "$t1 - $t0" | bc)"
[ "$KEEP" = 1 ] || rm -rf "$W"
