# bash completion for rlpipe's programs: rl-rollout, rl-reward, rl-train,
# rl-queue and rl-sync.  The options come from each program's option table
# as its --help prints it (so they never drift from the program), the
# commands of rl-queue, rl-sync and rl-rollout/rl-reward from this file.
# Installed by `make install` as share/bash-completion/completions/rlpipe
# (with a link per program); or: source completions/rlpipe.bash

# _rlpipe_opts CMD...: the long options CMD --help lists, one per line
_rlpipe_opts()
{
	"$@" --help 2>/dev/null | grep -oE -- '--[a-z0-9][a-z0-9-]*' | sort -u
}

_rlpipe()
{
	local cur prev prog sub cmds="" i
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD-1]}
	prog=${COMP_WORDS[0]}
	case $prog in
	*rl-queue) cmds="cat serve put get stat" ;;
	*rl-sync) cmds="serve push pull status publish" ;;
	*rl-rollout) cmds="tokenize" ;;
	*rl-reward) cmds="gen-arith" ;;
	esac
	# the command, if one was given before the word being completed
	sub=""
	for ((i = 1; i < COMP_CWORD; i++)); do
		case " $cmds " in *" ${COMP_WORDS[i]} "*) sub=${COMP_WORDS[i]}; break ;; esac
	done
	# values that are files or directories
	case $prev in
	--config|-o|--out|--output|-m|--model|--metrics|--tfevents|--ref|--data-dir|--init|--tokenizer|--resume|--weights-from|--eval-prompts)
		COMPREPLY=($(compgen -f -- "$cur"))
		return 0 ;;
	--device)
		COMPREPLY=($(compgen -W "auto cpu cuda" -- "$cur"))
		return 0 ;;
	--algo)
		COMPREPLY=($(compgen -W "grpo dr-grpo dapo gspo rloo reinforce++ remax ppo sft dpo rm" -- "$cur"))
		return 0 ;;
	--dpo-loss)
		COMPREPLY=($(compgen -W "sigmoid ipo hinge" -- "$cur"))
		return 0 ;;
	esac
	if [[ $cur == -* ]]; then
		if [[ -n $sub ]]; then
			COMPREPLY=($(compgen -W "$(_rlpipe_opts "$prog" "$sub")" -- "$cur"))
		else
			COMPREPLY=($(compgen -W "$(_rlpipe_opts "$prog")" -- "$cur"))
		fi
		return 0
	fi
	if [[ -z $sub && -n $cmds && ( $prog == *rl-queue || $prog == *rl-sync ) ]]; then
		COMPREPLY=($(compgen -W "$cmds" -- "$cur"))
		return 0
	fi
	COMPREPLY=($(compgen -f -- "$cur"))
}

complete -F _rlpipe rl-rollout rl-reward rl-train rl-queue rl-sync
