#!/usr/bin/env python3
"""Issue 12 #4 measurements (usage: bench/fanout.py BIN time [PORT] | BIN term PORT COUNT [same]): processing time of a PR body with N `Closes #N` through a
real `shepherd work`, and the SIGTERM stop time while large bodies are processed."""
import json, os, socket, subprocess, sys, time, signal

BIN = sys.argv[1]
MODE = sys.argv[2]  # "time" or "term"
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 6499
REPO = "forgejo-bot-test/widgets"
PREFIX = "meas"

def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out

class R:
    def __init__(self):
        self.s = socket.create_connection(("127.0.0.1", PORT)); self.f = self.s.makefile("rb")
    def cmd(self, *args):
        self.s.sendall(resp(*args)); return self.read()
    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in b"+-": return rest.decode()
        if t == b":": return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0: return None
            d = self.f.read(n + 2)[:-2]; return d
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]

def body(number, links):
    v = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "webhooks", "pull_request_sync.json")))
    v["number"] = number
    pr = v["pull_request"]; pr["number"] = number; pr["id"] = 10000 + number
    pr["body"] = "".join(f"Closes #{i}\n" for i in range(1, links + 1)) if links else "plain"
    pr["head"]["sha"] = "%040x" % (number << 32 | 1)
    pr["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    return json.dumps(v).encode()

def xadd(r, number, links):
    ms = int(time.time() * 1000)
    return r.cmd("XADD", "{%s:0}:events" % PREFIX, "*", "kind", "webhook", "delivery",
                 f"m{number}-{links}", "event", "pull_request_sync", "repo", REPO,
                 "received", ms, "body", body(number, links))

def hist(n):
    return "{%s:0}:hist:%s#%d" % (PREFIX, REPO, n)

redis = subprocess.Popen(["redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL)
time.sleep(0.5)
env = {k: v for k, v in os.environ.items() if not k.startswith("SHEPHERD_")}
env.update(SHEPHERD_REDIS_URL=f"redis://127.0.0.1:{PORT}", SHEPHERD_KEY_PREFIX=PREFIX,
           SHEPHERD_LISTEN="127.0.0.1:0", SHEPHERD_LOG="warn", SHEPHERD_RESYNC_INTERVAL_SECS="0")
r = R()
try:
    print("key check", r.cmd("PING"))
    work = subprocess.Popen([BIN, "work"], env=env)
    # Wait for the group to exist (the worker is reading).
    for _ in range(500):
        g = r.cmd("XINFO", "GROUPS", "{%s:0}:events" % PREFIX)
        if isinstance(g, list) and g: break
        time.sleep(0.01)
    if MODE == "time":
        n = 0
        for links in [0, 0, 100_000, 100_000, 100_000, 0, 100_000, 100_000]:
            n += 1
            payload = body(n, links)
            t0 = time.perf_counter(); xadd(r, n, links)
            while r.cmd("XLEN", hist(n)) == 0: pass
            dt = (time.perf_counter() - t0) * 1000
            print(f"links={links:>6} body={len(payload)/1e6:.2f} MB  xadd->committed {dt:.1f} ms")
        work.send_signal(signal.SIGTERM); work.wait(20)
    else:
        count = int(sys.argv[4]) if len(sys.argv) > 4 else 60
        # Stop the worker from reading while queueing: queue first, then start.
        work.send_signal(signal.SIGTERM); work.wait(20)
        same = len(sys.argv) > 5  # every entry for PR 1: one group, run one after the other
        for n in range(1, count + 1): xadd(r, 1 if same else n, 100_000) if not same else r.cmd("XADD", "{%s:0}:events" % PREFIX, "*", "kind", "webhook", "delivery", f"s{n}", "event", "pull_request_sync", "repo", REPO, "received", int(time.time()*1000), "body", body(1, 100_000))
        work = subprocess.Popen([BIN, "work"], env=env)
        while r.cmd("XLEN", hist(1)) == 0: pass
        t0 = time.perf_counter(); work.send_signal(signal.SIGTERM)
        code = work.wait(60)
        dt = time.perf_counter() - t0
        done = r.cmd("XLEN", hist(1)) if same else sum(1 for n in range(1, count + 1) if r.cmd("XLEN", hist(n)) > 0)
        pend = r.cmd("XPENDING", "{%s:0}:events" % PREFIX, "workers")[0]
        env2 = dict(env, SHEPHERD_RECLAIM_IDLE_SECS="1")
        again = subprocess.Popen([BIN, "work"], env=env2)
        t1 = time.perf_counter()
        while (r.cmd("XLEN", hist(1)) if same else 0) < count and time.perf_counter() - t1 < 60: time.sleep(0.05)
        after = r.cmd("XLEN", hist(1)) if same else None
        again.send_signal(signal.SIGTERM); again.wait(20)
        print(f"after a restart (reclaim idle 1 s): {after}/{count} committed, pending {r.cmd('XPENDING', '{%s:0}:events' % PREFIX, 'workers')[0]}")
        print(f"SIGTERM -> exit {dt*1000:.0f} ms (code {code}); {done}/{count} committed, {pend} left pending; XLEN events {r.cmd('XLEN', '{%s:0}:events' % PREFIX)}")
finally:
    redis.terminate(); redis.wait()
