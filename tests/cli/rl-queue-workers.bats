#!/usr/bin/env bats
# Stage workers report to the broker (lib/queue/wstat.c -> REPORT -> the broker's
# worker table): a short pipeline where rl-rollout, rl-reward and rl-train
# all report, /metrics parsed strictly and checked against `rl-queue stat
# --json`; per-worker lines in `rl-queue stat` and `--watch`; malformed and
# oversized reports sent by hand refused without harming the broker; progress
# lines on a terminal only (script(1) gives a pty).  Loopback only; daemons
# killed by pid in teardown.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load queue_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	write_model "$TD"
	for g in 1 2 3; do
		for i in 0 1; do
			printf '{"id":%d,"group":%d,"index":%d,"group_size":2,"version":[0,0],"prompt":[65,66,67],"response":[68,69,70],"reward":%d}\n' \
				$((g * 10 + i)) $g $i $i
		done
	done > "$TD/scored.jsonl"
}

setup() {
	D=$(mktemp -d /tmp/rlq-workers-bats.XXXXXX)
	PIDS=""
}

teardown() {
	kill_pids
	rm -rf "$D"
}

fetch() { http_get "$HTTP" "$1"; }

start_broker() { start_http_broker "" "$@"; }

# report URL JSON: one REPORT by hand; prints "STATUS MESSAGE"
report() {
	printf '%s' "$2" > "$D/rep.json"
	python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$1" report "$D/rep.json"
}

@test "all three stages report; /metrics has them, strictly formatted, agreeing with rl-queue stat --json" {
	start_broker --max-staleness 4
	export RL_STATS_INTERVAL=0.2
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	RL_WORKER_ID=gen-1 rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 6 --queue "$URL" --idle-exit 1.5 3>&- &
	R=$!
	RL_WORKER_ID=score-1 rl-reward -q --queue "$URL" --task length --max-length 8 --idle-exit 2 3>&- &
	W=$!
	PIDS="$PIDS $R $W"
	# --no-skip-zero-adv: equal rewards would skip every sequence, leaving the token means null
	RL_WORKER_ID=learn-1 run -0 --separate-stderr timeout -k 20 60 rl-train -q -m "$TD/m0" --out "$D/ck" --batch 2 --no-skip-zero-adv \
		--queue "$URL" --idle-exit 2.5 --metrics "$D/m.jsonl"
	wait "$R"
	wait "$W"
	fetch /metrics > "$D/metrics.txt"
	rl-queue stat --json "$URL" > "$D/stat.json"
	run python3 - "$D/metrics.txt" "$D/stat.json" "$D/m.jsonl" "$BATS_TEST_DIRNAME" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[4])
from promparse import parse
types, m = parse(open(sys.argv[1]).read())
st = json.load(open(sys.argv[2]))
steps = [json.loads(l) for l in open(sys.argv[3])]
ws = {w["worker"]: w for w in st["workers"]}
assert set(ws) == {"gen-1", "score-1", "learn-1"}, sorted(ws)
roles = {"gen-1": "rollout", "score-1": "reward", "learn-1": "train"}
def agree(key, want):
    got = m.get(key)
    assert got is not None, "missing " + key
    assert got == want, "%s: metrics %r, stat %r" % (key, got, want)
for wid, role in roles.items():
    w = ws[wid]
    assert w["role"] == role and w["state"] == "exited", w
    assert w["records"] > 0 and w["busy_s"] > 0 and w["idle_s"] > 0, w
    assert abs(w["busy_s"] + w["idle_s"] - w["uptime_s"]) < 0.05, w
    assert 0 <= w["busy_frac"] <= 1 and w["records_per_s"] > 0 and len(w["timeline"]) >= 2, w
    assert "gpu" not in w, "no GPU here: none may be shown"
    lab = '{role="%s",worker="%s"}' % (role, wid)
    agree("rlqueue_worker_busy_fraction" + lab, w["busy_frac"])
    agree("rlqueue_worker_busy_seconds_total" + lab, w["busy_s"])
    agree("rlqueue_worker_idle_seconds_total" + lab, w["idle_s"])
    agree("rlqueue_worker_records_total" + lab, w["records"])
    agree("rlqueue_worker_tokens_total" + lab, w["tokens"])
    agree("rlqueue_worker_records_per_second" + lab, w["records_per_s"])
    agree("rlqueue_worker_tokens_per_second" + lab, w["tokens_per_s"])
    agree("rlqueue_worker_up" + lab, 0)
    assert "rlqueue_worker_report_age_seconds" + lab in m
# rollout counts the samples it generated, the trainer the ones it trained
assert ws["gen-1"]["records"] == st["total"]["put_generated"], (ws["gen-1"], st["total"])
assert ws["score-1"]["records"] == st["total"]["put_scored"], (ws["score-1"], st["total"])
assert ws["gen-1"]["tokens"] > 0 and ws["learn-1"]["tokens"] > 0
assert ws["learn-1"]["records"] == sum(s["train/sequences"] for s in steps), (ws["learn-1"], [s["train/sequences"] for s in steps])
for s in ("rollout", "reward", "train"):
    agree('rlqueue_stage_workers{stage="%s"}' % s, st["stages"][s]["live"])
    agree('rlqueue_stage_records_per_second{stage="%s"}' % s, st["stages"][s]["records_per_s"])
    agree('rlqueue_stage_tokens_per_second{stage="%s"}' % s, st["stages"][s]["tokens_per_s"])
# the trainer's step metrics: the last step, the whole history
t, h, last = st["train"], st["train_history"], steps[-1]
assert t["version"] == last["step"] == st["version"] == len(steps), (t, st["version"], len(steps))
assert h["version"] == [s["step"] for s in steps], h["version"]
assert h["reward_mean"] == [s["critic/score/mean"] for s in steps]
assert h["response_length"] == [s["response_length/mean"] for s in steps]
agree("rlqueue_train_step_version", t["version"])
agree("rlqueue_trainer_version", st["version"])
agree("rlqueue_train_reward_mean", t["reward_mean"])
assert t["reward_mean"] == last["critic/score/mean"], (t, last)
agree("rlqueue_train_response_length_mean", t["response_length"])
agree("rlqueue_train_ppo_kl", t["ppo_kl"])
agree("rlqueue_train_entropy", t["entropy"])
agree("rlqueue_train_step_seconds", t["step_s"])
assert t["entropy"] == last["actor/entropy"] and t["step_s"] == last["timing_s/step"]
assert types["rlqueue_worker_busy_seconds_total"] == "counter"
assert types["rlqueue_worker_busy_fraction"] == "gauge"
assert m["rlqueue_reports_total"] >= 6 and m["rlqueue_bad_requests_total"] == 0, m["rlqueue_reports_total"]
print("ok", len(m), "samples", len(steps), "steps")
EOF
	assert_success
	assert_output --partial "ok "
}

@test "rl-queue stat and --watch show a line per worker, the stages and the last train step" {
	start_broker
	run report "$URL" '{"role":"rollout","worker":"gpu-node:11","device":"cuda:0","uptime_s":10,"busy_s":9,"idle_s":1,"records":500,"tokens":64000,"gpu":{"index":0,"name":"Test GPU","util":0.91,"mem_util":0.4,"mem_used":21474836480,"mem_total":85899345920}}'
	assert_output "0 "
	run report "$URL" '{"role":"reward","worker":"cpu-node:12","uptime_s":10,"busy_s":2.5,"idle_s":7.5,"records":480,"tokens":0}'
	assert_output "0 "
	run report "$URL" '{"role":"train","worker":"learner:13","uptime_s":10,"busy_s":8,"idle_s":2,"records":256,"tokens":30000,"steps":[{"version":7,"reward_mean":0.625,"response_length":118,"ppo_kl":0.002,"entropy":1.5,"step_s":1.25}]}'
	assert_output "0 "
	run -0 --separate-stderr rl-queue stat "$URL"
	assert_line --regexp '^rollout +gpu-node:11 +live +90% +50\.0 +6400\.0 +500 .* 91% 20\.0/80\.0 GiB$'
	assert_line --regexp '^reward +cpu-node:12 +live +25% +48\.0 +0\.0 +480 .* -$'
	assert_line --regexp '^train +learner:13 +live +80% +25\.6 '
	assert_line --partial 'stages: rollout 1 live 50.0 records/s; reward 1 live 48.0 records/s; train 1 live 25.6 records/s;'
	assert_line --partial 'train: version 7  reward 0.625  length 118  ppo_kl 0.002  entropy 1.5  step 1.25s'
	run -0 --separate-stderr timeout -k 20 20 rl-queue stat "$URL" --watch 0.1 --count 2
	[ "$(grep -c '^rollout  *gpu-node:11 ' <<< "$output")" = 2 ]
	[ "$(grep -c '^train  *learner:13 ' <<< "$output")" = 2 ]
	# the GPU, as reported, on /metrics
	fetch /metrics > "$D/m.txt"
	grep -qx 'rlqueue_worker_gpu_utilization_ratio{role="rollout",worker="gpu-node:11",gpu="0"} 0.91000000000000003' "$D/m.txt"
	grep -qx 'rlqueue_worker_gpu_memory_total_bytes{role="rollout",worker="gpu-node:11",gpu="0"} 85899345920' "$D/m.txt"
	! grep -q 'gpu.*worker="cpu-node:12"' "$D/m.txt" || false
}

@test "malformed and oversized stats reports are refused with a reason; the broker keeps serving" {
	start_broker
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	good='{"role":"reward","worker":"ok-1","uptime_s":1,"busy_s":0.5,"idle_s":0.5,"records":3,"tokens":0}'
	run report "$URL" '{"role":"reward","worker":"x"'
	assert_output --partial "5 malformed stats report: not JSON"
	run report "$URL" '{"role":"judge","worker":"x","uptime_s":1,"busy_s":1,"idle_s":0,"records":1,"tokens":0}'
	assert_output --partial "5 malformed stats report: 'role' is not rollout, reward or train"
	run report "$URL" '{"role":"reward","worker":"x\"} 1\nfake_metric{","uptime_s":1,"busy_s":1,"idle_s":0,"records":1,"tokens":0}'
	assert_output --partial "'worker' holds a character that is not allowed"
	run report "$URL" '{"role":"reward","worker":"x","uptime_s":1,"busy_s":-1,"idle_s":0,"records":1,"tokens":0}'
	assert_output --partial "'busy_s' is out of range"
	# oversized: 100 KB of JSON, and a compressed body claiming 100 MB
	python3 -c 'import json; print(json.dumps({"role": "reward", "worker": "big", "uptime_s": 1, "busy_s": 1, "idle_s": 0, "records": 1, "tokens": 0, "pad": "x" * 100000}))' > "$D/big.json"
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" report "$D/big.json"
	assert_output --partial "8 stats report over 65536 bytes"
	printf '(\265/\375\0\0\0\0\0' > "$D/z.bin"
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" report "$D/z.bin" zstd-claim 100000000
	[[ "$output" == 5\ * || "$output" == 8\ * ]]
	# still serving: a good report is taken, stats and /metrics answer, the queue is intact
	run report "$URL" "$good"
	assert_output "0 "
	kill -0 "$BROKER"
	rl-queue stat --json "$URL" > "$D/stat.json"
	fetch /metrics > "$D/metrics.txt"
	run python3 - "$D/stat.json" "$D/metrics.txt" "$BATS_TEST_DIRNAME" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[3])
from promparse import parse
st = json.load(open(sys.argv[1]))
types, m = parse(open(sys.argv[2]).read())
assert [w["worker"] for w in st["workers"]] == ["ok-1"], st["workers"]
assert st["server"]["bad_requests"] == 6 and st["server"]["reports"] == 1, st["server"]
assert st["depth"]["prompt"] == 12, st["depth"]
assert m['rlqueue_worker_records_total{role="reward",worker="ok-1"}'] == 3
assert not any("fake_metric" in k for k in m)
print("ok")
EOF
	assert_output "ok"
}

@test "progress lines: drawn on a terminal (rl-train steps, rl-queue put records, rl-rollout), quiet otherwise" {
	command -v script >/dev/null || skip "script(1) (util-linux) is not installed"
	start_broker
	# not a terminal: no progress line at all
	run -0 --separate-stderr rl-queue put "$URL" "$TD/prompts.jsonl"
	[[ "$stderr" != *$'\r'* && "$stderr" != *"records/s"* ]]
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$D/ck1" --batch 1 --max-steps 3 --metrics "$D/m1.jsonl" "$TD/scored.jsonl"
	[[ "$stderr" != *$'\r'* && "$stderr" != *"steps/s"* ]]
	# a pty: the bar, redrawn in place, and a newline at the end
	run -0 script -qec "rl-queue put $URL $TD/prompts.jsonl" /dev/null < /dev/null
	[[ "$output" == *$'\r'"rl-queue: [####################] 100% 12 records,"* ]]
	[[ "$output" == *"put: 12 records: 0 accepted, 12 duplicates"* ]]
	run -0 script -qec "rl-train -m $TD/m0 --out $D/ck2 --batch 1 --max-steps 3 --metrics $D/m2.jsonl $TD/scored.jsonl" /dev/null < /dev/null
	[[ "$output" == *$'\r'"rl-train: [#######.............]  33% 1/3 steps,"* || "$output" == *$'\r'"rl-train: [####################] 100% 3/3 steps,"* ]]
	[[ "$output" == *"100% 3/3 steps, "*" steps/s"* ]]
	[ "$(wc -l < "$D/m2.jsonl")" = 3 ]
	# -q: nothing
	run -0 script -qec "rl-train -q -m $TD/m0 --out $D/ck3 --batch 1 --max-steps 2 --metrics $D/m3.jsonl $TD/scored.jsonl" /dev/null < /dev/null
	[[ "$output" != *"steps/s"* ]]
	# rl-rollout's line comes from the same code
	head -4 "$TD/prompts.jsonl" | sed 's/prompt_text/prompt/' > "$D/p.jsonl"
	run -0 script -qec "rl-rollout -m $TD/m0 -n 2 --max-tokens 4 -o $D/out.bin $D/p.jsonl" /dev/null < /dev/null
	[[ "$output" == *$'\r'"rl-rollout: "*"prompts, "*" tokens/s"* ]]
}
