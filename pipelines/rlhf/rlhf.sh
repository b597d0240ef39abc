#!/bin/sh
# pipelines/rlhf/rlhf.sh — InstructGPT-style RLHF with rlpipe's programs, small
# enough for a CPU: an SFT model, a reward model trained on preference pairs,
# then PPO (a critic on the policy's trunk) against that reward model.
#
# The task hides a rule: a response is 8 letters of 'a' and 'b', and a
# response with more 'a's is the better one.  The programs never see the
# rule, only pairs ranked by it:
#   1. SFT (rl-train --algo sft): a byte-level model from scratch learns the
#      format, random a/b strings after "NAME:" and a newline.
#   2. RM (rl-train --algo rm -m SFT): a Bradley-Terry reward model on pairs
#      {"prompt", "chosen", "rejected"}, written as a Hugging Face
#      Qwen2ForSequenceClassification directory; its held-out pair accuracy
#      is printed (rl-reward --model on both sides of held-out pairs).
#   3. PPO in the pipe wiring:
#        rl-rollout -m SFT -n SAMPLES | rl-reward --model RM | rl-train --algo ppo
#      the policy's new weights go back to rl-rollout by checkpoint
#      directory (--weights-from, on-policy: --max-staleness 0).
# Prints the hidden rule's score (the mean share of 'a' in greedy responses
# to held-out prompts) after SFT and after PPO, writes summary.json, and with
# GOAL=1 exits 1 unless PPO raised it by GOAL_GAIN.  Settings from the
# environment (defaults below); every stage's log is under RUN/logs.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
SEED=${SEED:-1}
RUN=${RUN:-runs/rlhf}
SFT_STEPS=${SFT_STEPS:-150}
SFT_BATCH=${SFT_BATCH:-32}
SFT_LR=${SFT_LR:-2e-3}
PAIRS=${PAIRS:-512}
RM_BATCH=${RM_BATCH:-16}
RM_LR=${RM_LR:-1e-3}
RL_STEPS=${RL_STEPS:-40}
PROMPTS=${PROMPTS:-16}
SAMPLES=${SAMPLES:-4}
RL_LR=${RL_LR:-5e-4}
TEST_N=${TEST_N:-64}
GOAL=${GOAL:-0}
GOAL_GAIN=${GOAL_GAIN:-0.1}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

for p in rl-train rl-rollout rl-reward python3; do
	command -v $p >/dev/null 2>&1 || { echo "rlhf: $p not found on PATH" >&2; exit 1; }
done
fail() { echo "rlhf: $1 failed; see $2" >&2; tail -n 5 "$2" >&2; exit 1; }

rm -rf "$RUN"
mkdir -p "$RUN/logs" "$RUN/data"
RUN=$(cd "$RUN" && pwd)
L=$RUN/logs
D=$RUN/data

# ---- data: SFT rows, ranked pairs, RL and held-out prompts --------------------------
python3 - "$D" "$SEED" "$SFT_STEPS" "$SFT_BATCH" "$PAIRS" "$RL_STEPS" "$PROMPTS" "$TEST_N" <<'PY'
import json, random, sys
out, seed, sft_steps, sft_batch, pairs, rl_steps, prompts, test_n = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(seed)
name = lambda: "".join(rng.choice("cdefghijk") for _ in range(3)) + ":"
resp = lambda: "".join(rng.choice("ab") for _ in range(8))
score = lambda s: s.count("a")
w = lambda f, rows: f.write("".join(json.dumps(r) + "\n" for r in rows))
with open(out + "/sft.jsonl", "w") as f:
    w(f, ({"prompt": name(), "completion": resp() + "\n"} for _ in range(sft_steps * sft_batch)))
def pair():
    while True:
        a, b = resp(), resp()
        if score(a) != score(b):
            return (a, b) if score(a) > score(b) else (b, a)
with open(out + "/pairs.jsonl", "w") as f, open(out + "/heldout.jsonl", "w") as h:
    for i in range(pairs + 64):
        c, r = pair()
        p = name()
        (f if i < pairs else h).write(json.dumps({"prompt": p, "chosen": c + "\n", "rejected": r + "\n"}) + "\n")
with open(out + "/prompts.jsonl", "w") as f:
    w(f, ({"prompt": name()} for _ in range(rl_steps * prompts)))
with open(out + "/test.jsonl", "w") as f:
    w(f, ({"prompt": name()} for _ in range(test_n)))
PY

# the hidden rule on greedy responses to the held-out prompts: the mean share of 'a'
rule_score() {
	rl-rollout -q -m "$1" --temperature 0 --max-tokens 9 --stop "
" --jsonl "$D/test.jsonl" 2>>"$L/eval.log" | python3 -c '
import json, sys
s = [json.loads(l).get("response_text", "") for l in sys.stdin]
print("%.3f" % (sum(min(r.count("a"), 8) / 8 for r in s) / max(len(s), 1)))'
}

echo "rlhf: seed $SEED; run directory $RUN"
rl-train -q --init "$here/model.json" --tokenizer bytes --out "$RUN/init" --seed "$SEED" 2>"$L/init.log" ||
	fail "rl-train --init" "$L/init.log"
echo "rlhf: 1. SFT: $SFT_STEPS steps x $SFT_BATCH rows"
rl-train -q -m "$RUN/init" --out "$RUN/sft" --algo sft --seed "$SEED" --batch "$SFT_BATCH" --lr "$SFT_LR" --keep 1 \
    --metrics "$RUN/sft-metrics.jsonl" "$D/sft.jsonl" 2>"$L/sft.log" || fail SFT "$L/sft.log"
SFT=$RUN/sft/$(readlink "$RUN/sft/latest")
s0=$(rule_score "$SFT")
echo "rlhf:    hidden rule after SFT: $s0"

echo "rlhf: 2. reward model: $PAIRS pairs, batches of $RM_BATCH"
rl-train -q -m "$SFT" --out "$RUN/rm" --algo rm --seed "$SEED" --batch "$RM_BATCH" --lr "$RM_LR" --keep 1 \
    --metrics "$RUN/rm-metrics.jsonl" "$D/pairs.jsonl" 2>"$L/rm.log" || fail "reward model training" "$L/rm.log"
RM=$RUN/rm/$(readlink "$RUN/rm/latest")
# held-out pairs: both sides as records of token ids (the bytes tokenizer:
# one id per byte, text pairs encoded without special tokens as rl-train
# encodes them), scored by rl-reward --model; accuracy: chosen above rejected
python3 - "$D/heldout.jsonl" > "$D/heldout-recs.jsonl" <<'PY'
import json, sys
ids = lambda s: list(s.encode())
for g, l in enumerate(open(sys.argv[1])):
    p = json.loads(l)
    for i, k in enumerate(("chosen", "rejected")):
        print(json.dumps({"id": 2 * g + i, "group": g, "index": i, "group_size": 2,
                          "prompt": ids(p["prompt"]), "response": ids(p[k])}))
PY
rl-reward -q --model "$RM" --jsonl "$D/heldout-recs.jsonl" 2>"$L/rm-eval.log" > "$D/heldout-scored.jsonl" ||
	fail "rl-reward --model" "$L/rm-eval.log"
acc=$(python3 -c '
import json, sys
s = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    s.setdefault(r["group"], {})[r["index"]] = r["meta"]["scores"]["model"]
print("%.3f" % (sum(g[0] > g[1] for g in s.values()) / max(len(s), 1)))' "$D/heldout-scored.jsonl")
echo "rlhf:    held-out pair accuracy: $acc"

echo "rlhf: 3. PPO against the reward model: $RL_STEPS steps x $PROMPTS prompts x $SAMPLES samples"
CK=$RUN/ppo
rl-rollout -m "$SFT" --seed "$SEED" -n "$SAMPLES" --max-tokens 9 --stop "
" --weights-from "$CK" --max-staleness 0 --train-batch "$PROMPTS" "$D/prompts.jsonl" 2>"$L/rollout.log" |
	rl-reward --model "$RM" 2>"$L/reward.log" |
	rl-train -m "$SFT" --out "$CK" --algo ppo --seed "$SEED" --batch "$PROMPTS" --lr "$RL_LR" --keep 2 \
	    --max-steps "$RL_STEPS" --metrics "$RUN/ppo-metrics.jsonl" - 2>"$L/train.log" ||
	fail PPO "$L/train.log"
FINAL=$CK/$(readlink "$CK/latest")
s1=$(rule_score "$FINAL")
echo "rlhf:    hidden rule after PPO: $s1 ($(wc -l < "$RUN/ppo-metrics.jsonl") steps)"
printf '{"seed":%s,"rm_heldout_accuracy":%s,"rule_sft":%s,"rule_ppo":%s,"ppo_steps":%s}\n' \
    "$SEED" "$acc" "$s0" "$s1" "$(wc -l < "$RUN/ppo-metrics.jsonl")" > "$RUN/summary.json"
if [ "$GOAL" = 1 ] && ! python3 -c 'import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) < float(sys.argv[3]))' \
    "$s0" "$s1" "$GOAL_GAIN"; then
	echo "rlhf: the hidden rule's score did not rise by $GOAL_GAIN ($s0 -> $s1)" >&2
	exit 1
fi
