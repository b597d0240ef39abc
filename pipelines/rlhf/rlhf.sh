#!/bin/sh
# pipelines/rlhf/rlhf.sh — preference learning with rlpipe's programs, small
# enough for a CPU (make demo-prefs): an SFT model, a reward model trained on
# preference pairs, then PPO (a critic on the policy's trunk) against that
# reward model (InstructGPT-style RLHF), and DPO on the same pairs.
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
#   4. DPO (rl-train --algo dpo -m SFT, --beta 0.1) on the same pair lines,
#      one pass; the reference is the SFT model.
# Prints the hidden rule's score (the mean share of 'a' in greedy responses
# to held-out prompts) after SFT, PPO and DPO, writes summary.json and (with
# gnuplot) prefs.png, and with GOAL=1 exits 1 unless PPO and DPO each raised
# it by GOAL_GAIN.  Settings from the environment (defaults below); every
# stage's log is under RUN/logs.
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
DPO_BATCH=${DPO_BATCH:-32}
DPO_LR=${DPO_LR:-1e-3}
DPO_BETA=${DPO_BETA:-0.1}
PLOT=${PLOT:-1}
TEST_N=${TEST_N:-64}
GOAL=${GOAL:-1}
GOAL_GAIN=${GOAL_GAIN:-0.2}
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

echo "rlhf: 4. DPO on the same pairs: batches of $DPO_BATCH, beta $DPO_BETA, lr $DPO_LR, one pass"
rl-train -q -m "$SFT" --out "$RUN/dpo" --algo dpo --beta "$DPO_BETA" --seed "$SEED" --batch "$DPO_BATCH" \
    --lr "$DPO_LR" --keep 1 --metrics "$RUN/dpo-metrics.jsonl" "$D/pairs.jsonl" 2>"$L/dpo.log" || fail DPO "$L/dpo.log"
s2=$(rule_score "$RUN/dpo/$(readlink "$RUN/dpo/latest")")
echo "rlhf:    hidden rule after DPO: $s2 ($(wc -l < "$RUN/dpo-metrics.jsonl") steps)"
echo ""
echo "  hidden rule (share of 'a', greedy, $TEST_N held-out prompts)"
echo "    after SFT   $s0"
echo "    after PPO   $s1   (reward model: held-out pair accuracy $acc)"
echo "    after DPO   $s2"
printf '{"seed":%s,"rm_heldout_accuracy":%s,"rule_sft":%s,"rule_ppo":%s,"rule_dpo":%s,"ppo_steps":%s,"dpo_steps":%s}\n' \
    "$SEED" "$acc" "$s0" "$s1" "$s2" "$(wc -l < "$RUN/ppo-metrics.jsonl")" "$(wc -l < "$RUN/dpo-metrics.jsonl")" \
    > "$RUN/summary.json"

if [ "$PLOT" = 1 ] && command -v gnuplot >/dev/null 2>&1; then
	metric() { python3 -c 'import json, sys
for i, l in enumerate(open(sys.argv[1])):
    print(i + 1, json.loads(l).get(sys.argv[2], "NaN"))' "$@"; }
	metric "$RUN/ppo-metrics.jsonl" critic/score/mean > "$RUN/ppo-score.tsv"
	metric "$RUN/dpo-metrics.jsonl" rewards/margins > "$RUN/dpo-margins.tsv"
	printf '0 SFT %s\n1 PPO %s\n2 DPO %s\n' "$s0" "$s1" "$s2" > "$RUN/rule.tsv"
	gnuplot <<EOF 2>"$L/gnuplot.log" || echo "rlhf: gnuplot failed; see $L/gnuplot.log" >&2
set terminal pngcairo size 1200,420 noenhanced
set output '$RUN/prefs.png'
set multiplot layout 1,3 title 'rlpipe preference demo (seed $SEED): hidden rule = share of a'
set grid
set title 'hidden rule, greedy held-out'
set yrange [0:1]
set boxwidth 0.6
set style fill solid 0.7
plot '$RUN/rule.tsv' using 1:3:xtic(2) with boxes lc rgb '#1f5fa8' notitle
set autoscale y
set title 'PPO: reward-model score per step'
set xlabel 'PPO step'
plot '$RUN/ppo-score.tsv' using 1:2 with linespoints pt 7 ps 0.5 lc rgb '#c0392b' title 'critic/score/mean'
set title 'DPO: rewards/margins per step'
set xlabel 'DPO step'
plot '$RUN/dpo-margins.tsv' using 1:2 with linespoints pt 7 ps 0.5 lc rgb '#27ae60' title 'rewards/margins'
unset multiplot
EOF
	[ -f "$RUN/prefs.png" ] && echo "rlhf: wrote $RUN/prefs.png"
fi

if [ "$GOAL" = 1 ]; then
	if awk -v a="$s0" -v p="$s1" -v d="$s2" -v g="$GOAL_GAIN" 'BEGIN { exit !(p >= a + g && d >= a + g) }'; then
		echo "rlhf: promise met: hidden rule $s0 -> PPO $s1, DPO $s2"
	else
		echo "rlhf: promise NOT met: hidden rule $s0 -> PPO $s1, DPO $s2 (wanted +$GOAL_GAIN each)" >&2
		exit 1
	fi
fi
exit 0
