#!/bin/sh
# A calculator environment in shell for rl-rollout --env (rl-env(5)), with jq.
# The prompt line has "a" and "b"; a turn holding <calc>X+Y</calc> (integers)
# is answered with the sum; "ANSWER: N" ends the episode, reward 1 when
# N = a + b.  The state of each episode is kept in a file named by its id.
set -u
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
while IFS= read -r req; do
	op=$(printf '%s' "$req" | jq -r '.op')
	id=$(printf '%s' "$req" | jq -r '.id')
	case $op in
	reset)
		printf '%s' "$req" | jq -r '.line.a + .line.b' > "$dir/$id"
		echo '{"observation": "", "done": false}' ;;
	step)
		act=$(printf '%s' "$req" | jq -r '.action')
		want=$(cat "$dir/$id" 2>/dev/null) || { echo '{"error": "step before reset"}'; continue; }
		ans=$(printf '%s' "$act" | sed -n 's/.*ANSWER: *\(-\{0,1\}[0-9][0-9]*\).*/\1/p' | head -n 1)
		call=$(printf '%s' "$act" | sed -n 's/.*<calc> *\([0-9][0-9]*\) *+ *\([0-9][0-9]*\) *<\/calc>.*/\1 \2/p' | head -n 1)
		if [ -n "$ans" ]; then
			r=0; [ "$ans" = "$want" ] && r=1
			rm -f "$dir/$id"
			echo "{\"observation\": \"\", \"reward\": $r, \"done\": true}"
		elif [ -n "$call" ]; then
			set -- $call
			echo "{\"observation\": \"$(($1 + $2))\", \"role\": \"tool\", \"reward\": 0, \"done\": false}"
		else
			echo '{"observation": "Use <calc>X+Y</calc> or write ANSWER: N.", "reward": 0, "done": false}'
		fi ;;
	*) echo '{"error": "unknown op"}' ;;
	esac
done
