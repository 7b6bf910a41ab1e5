#!/usr/bin/env python3
"""Writes Redis protocol (for `redis-cli --pipe`) that queues events-stream entries the
way ingest and the executor do, for bench/worker.sh.

  worker_load.py warmup PREFIX PRS FIXTURE   one pull_request_sync webhook per PR
  worker_load.py status PREFIX PRS EVENTS    CI observations (internal ObservedStatus)

Every entry goes to shard 0 ({PREFIX:0}:events), repository forgejo-bot-test/widgets.
A PR's head sha in the warm-up equals the sha its observations are about.
"""
import json
import sys
import time

REPO = "forgejo-bot-test/widgets"


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def sha(n):
    return "%040x" % (n << 32)


def entry(stream, kind, delivery, event, body):
    now = int(time.time() * 1000)
    return resp("XADD", stream, "*", "kind", kind, "delivery", delivery, "event", event,
                "repo", REPO, "received", now, "body", body)


def warmup(stream, prs, fixture):
    base = json.load(open(fixture))
    w = sys.stdout.buffer
    for n in range(1, prs + 1):
        base["number"] = n
        pr = base["pull_request"]
        pr["number"], pr["id"], pr["body"] = n, 10_000 + n, "bench PR"
        pr["head"]["sha"] = sha(n)
        w.write(entry(stream, "webhook", "warm-%d" % n, "pull_request_sync", json.dumps(base)))


def status(stream, prs, events):
    states = ["pending", "success", "pending", "failure", "pending", "success"]
    w = sys.stdout.buffer
    t0 = int(time.time() * 1000)
    for i in range(events):
        n = i % prs + 1
        k = i // prs
        contexts = [
            {"context": "ci / test (pull_request)", "state": states[k % len(states)],
             "description": "step %d" % k, "target_url": "https://ci.example/run/%d" % k,
             "updated_ms": t0 + k},
            {"context": "ci / lint (pull_request)", "state": "success",
             "description": "ok", "target_url": "https://ci.example/lint", "updated_ms": t0},
        ]
        body = {"type": "observed-status", "repo": REPO, "number": n, "sha": sha(n),
                "contexts": contexts, "at_ms": t0 + k}
        w.write(entry(stream, "internal", "obs-%d" % i, "observed/status", json.dumps(body)))


if __name__ == "__main__":
    mode, prefix, prs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stream = "{%s:0}:events" % prefix
    if mode == "warmup":
        warmup(stream, prs, sys.argv[4])
    else:
        status(stream, prs, int(sys.argv[4]))
