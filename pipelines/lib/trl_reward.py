#!/usr/bin/env python3
"""trl_reward.py: runs a TRL reward function (GRPOTrainer's reward_funcs) as
an rl-reward --exec worker:

    rl-reward --exec 'python3 trl_reward.py [--chat] my_rewards.py NAME' -j 8 ...

TRL calls a reward function on a batch, by keyword: prompts, completions,
completion_ids and every other dataset column, each a list, and takes a list
of floats back.  This calls it on a batch of one record: prompts = [prompt_text],
completions = [response_text], completion_ids = [response], and each key of
meta as a one-element list (the columns of the prompt line that rl-rollout
kept in meta: "answer", "solution", ...), plus trainer_state=None.

--chat: the dataset was conversational, so TRL would pass each completion as
[{"role": "assistant", "content": text}] (and the prompt as its messages: here
[{"role": "user", "content": prompt_text}], the rendered text, as rl-rollout
keeps no messages).

A None score (TRL: "does not apply to this sample"), a raising call or a
result that is not one number fails the record (NaN, meta.reward_error
"exec: junk ..."), with the reason and the record's id on standard error.
"""
import importlib.util
import json
import math
import sys
import traceback


def load(path, name):
    try:
        spec = importlib.util.spec_from_file_location("trl_custom_reward", path)
        if spec is None or spec.loader is None:
            raise ImportError("not a Python file")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.stderr.write("trl_reward.py: cannot load '%s': %s: %s\n" % (path, type(e).__name__, e))
        sys.exit(2)
    fn = getattr(mod, name, None)
    if not callable(fn):
        sys.stderr.write("trl_reward.py: '%s' has no function '%s'\n" % (path, name))
        sys.exit(2)
    return fn


def call(fn, rec, chat):
    meta = rec.get("meta") or {}
    prompt, completion = rec.get("prompt_text", ""), rec.get("response_text", "")
    if chat:
        prompt = [{"role": "user", "content": prompt}]
        completion = [{"role": "assistant", "content": completion}]
    cols = {k: [v] for k, v in meta.items() if k not in ("prompts", "completions", "completion_ids")}
    out = fn(prompts=[prompt], completions=[completion], completion_ids=[rec.get("response", [])],
             trainer_state=None, **cols)
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        raise ValueError("want a list of one score, got %r" % (out,))
    if out[0] is None:
        raise ValueError("the function returned None (does not apply to this sample)")
    v = float(out[0])
    if not math.isfinite(v):
        raise ValueError("the score is %r" % v)
    return v


def main():
    args = sys.argv[1:]
    chat = bool(args) and args[0] == "--chat"
    if chat:
        args = args[1:]
    if len(args) != 2 or args[0] in ("-h", "--help"):
        sys.stderr.write("usage: trl_reward.py [--chat] REWARD_FILE.py FUNCTION\n")
        sys.exit(2)
    fn = load(args[0], args[1])
    for line in sys.stdin:
        rec = json.loads(line)
        try:
            print(json.dumps({"reward": call(fn, rec, chat)}), flush=True)
        except Exception:
            sys.stderr.write("trl_reward.py: record %s: %s" % (rec.get("id"), traceback.format_exc()))
            print(json.dumps({"error": "the reward function failed"}), flush=True)


if __name__ == "__main__":
    main()
