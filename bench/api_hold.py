#!/usr/bin/env python3
"""Issue 12, finding 2: RSS of a running shepherd under unauthenticated slow and
compressed bodies sent to the results and admin APIs (loopback only).

usage: bench/api_hold.py HOST:PORT PID [CONNECTIONS]

Opens CONNECTIONS (default 20) connections per kind, without a token:
  gzip: Content-Encoding: gzip, a 5 KB gzip of zeros that inflates to ~5 MiB;
  slow: a 4 MiB Content-Length, then one byte a second.
Half go to /api/v1/work/x/result, half to /api/v1/admin/replay. Prints the RSS
before, its peak while the connections are held (sampled every 100 ms for 5 s), and
how many connections the server still holds open after the 3 s body timeout.
"""
import gzip, socket, sys, time

def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0

def main():
    host, port = sys.argv[1].rsplit(":", 1)
    pid = int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    bomb = gzip.compress(b"0" * (5 * 1024 * 1024 - 64), 9)
    paths = ["/api/v1/work/x:y:pr:1:1/result", "/api/v1/admin/replay"]
    before = rss_kib(pid)
    socks = []
    for i in range(n):
        for kind in ("gzip", "slow"):
            s = socket.create_connection((host, int(port)))
            s.setblocking(True)
            path = paths[i % 2]
            if kind == "gzip":
                head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n")
                s.sendall(head.encode() + bomb)
            else:
                head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: 4194304\r\n\r\n")
                s.sendall(head.encode())
            socks.append((kind, s))
    start = time.time()
    peak = before
    answers = {}
    while time.time() - start < 5:
        peak = max(peak, rss_kib(pid))
        for kind, s in socks:
            if kind == "slow":
                try:
                    s.send(b" ")
                except OSError:
                    pass
        time.sleep(0.1)
    still_open = 0
    for kind, s in socks:
        s.settimeout(0.2)
        try:
            data = s.recv(4096)
            code = data.split()[1].decode() if data else "closed"
            answers[(kind, code)] = answers.get((kind, code), 0) + 1
            # An answered connection may linger; a second read tells closed from open.
            if s.recv(1) != b"":
                still_open += 1
        except socket.timeout:
            still_open += 1
        except OSError:
            answers[(kind, "reset")] = answers.get((kind, "reset"), 0) + 1
        s.close()
    after = rss_kib(pid)
    print(f"connections: {len(socks)} ({n} gzip + {n} slow)")
    print(f"rss_kib before={before} peak={peak} after={after} growth_peak={peak - before}")
    print(f"answers: {sorted(answers.items())}")
    print(f"held open after 5 s: {still_open}")

if __name__ == "__main__":
    main()
