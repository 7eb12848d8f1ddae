"""loss_log.py: the training losses of train_mt --metrics files, for the
checkpoint test's comparisons of resumed runs with a straight one (test_checkpoint.sh)."""
import json
import sys


def losses(name):
    """step -> loss of the training rows of NAME.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, open(name + ".jsonl")) if "loss" in r}


def start(ref_name):
    """A comparison's start: the tolerance (argv[1]), the reference run's losses, no parts, no failures."""
    return float(sys.argv[1]), losses(ref_name), [], []


def finish(bad, summary):
    """Exits with the failures when there are any, else prints the summary."""
    if bad:
        sys.exit("FAIL: " + "; ".join(bad))
    print(summary)
