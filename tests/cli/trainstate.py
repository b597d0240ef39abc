"""tests/cli/trainstate.py — reading rl-train's trainer_state.json in the
bats files' Python checks (PYTHONPATH=$BATS_TEST_DIRNAME)."""
import json


def groups_done(path):
    """The state and the set of group ids in its groups_done, whose entries
    are ids or "LO-HI" ranges (docs/queue.md, "Exactly once")."""
    s = json.load(open(path))
    done = set()
    for r in s["groups_done"]:
        lo, _, hi = str(r).partition("-")
        done.update(range(int(lo), int(hi or lo) + 1))
    return s, done
