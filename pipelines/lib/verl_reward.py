#!/usr/bin/env python3
"""verl_reward.py: runs a verl custom reward function as an rl-reward --exec
worker, so that a reward file written for verl works unchanged:

    rl-reward --exec 'python3 verl_reward.py my_reward.py [NAME]' -j 8 ...

NAME is the function (default compute_score, as verl's
custom_reward_function.name).  verl calls it as
NAME(data_source, solution_str, ground_truth, extra_info) and so does this:
data_source is meta.data_source, solution_str the record's response_text,
ground_truth meta.reward_model.ground_truth (else meta.answer), extra_info
meta.extra_info.  It may return a number (or bool) or a dict holding "score"
(its other keys are verl's extra metrics; they are not carried here).

A call that raises is written to standard error with the record's id, and
the reply is not a number, so rl-reward fails that record (NaN reward,
meta.reward_error "exec: junk ...") and starts a new worker.
"""
import importlib.util
import json
import math
import sys
import traceback


def load(path, name):
    try:
        spec = importlib.util.spec_from_file_location("verl_custom_reward", path)
        if spec is None or spec.loader is None:
            raise ImportError("not a Python file")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:  # the file's own error, named with the file
        sys.stderr.write("verl_reward.py: cannot load '%s': %s: %s\n" % (path, type(e).__name__, e))
        sys.exit(2)
    fn = getattr(mod, name, None)
    if not callable(fn):
        sys.stderr.write("verl_reward.py: '%s' has no function '%s'\n" % (path, name))
        sys.exit(2)
    return fn


def score_of(out):
    if isinstance(out, dict):
        if "score" not in out:
            raise ValueError("the returned dict has no 'score'")
        out = out["score"]
    v = float(out)  # bool, int, float, numpy scalars
    if not math.isfinite(v):
        raise ValueError("the score is %r" % v)
    return v


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        sys.stderr.write("usage: verl_reward.py REWARD_FILE.py [FUNCTION]\n")
        sys.exit(2)
    fn = load(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "compute_score")
    for line in sys.stdin:
        rec = json.loads(line)
        meta = rec.get("meta") or {}
        rm = meta.get("reward_model")
        truth = rm.get("ground_truth") if isinstance(rm, dict) and "ground_truth" in rm else meta.get("answer")
        try:
            v = score_of(fn(data_source=meta.get("data_source"), solution_str=rec.get("response_text", ""),
                            ground_truth=truth, extra_info=meta.get("extra_info")))
            print(json.dumps({"reward": v}), flush=True)
        except Exception:
            sys.stderr.write("verl_reward.py: record %s: %s" % (rec.get("id"), traceback.format_exc()))
            print(json.dumps({"error": "the reward function failed"}), flush=True)


if __name__ == "__main__":
    main()
