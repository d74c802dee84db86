#!/usr/bin/env python3
"""Templates on bwrap (issue 58): what keeping a session's workspace of
10,000 files as a template costs, and what starting a session from it
costs (POST /v1/sessions with "from", the session's sandbox up and its
first exec answered), paired against starting a copy-on-write session on
the same workspace as a plain project; then four forks started at once.

Usage: benches/templates.py --hull PATH [--files N] [--rounds N] [--tier T]
"""
import argparse, json, os, shutil, socket, statistics, subprocess, tempfile, threading, time


def call(sock, method, path, body=None):
    """One HTTP/1.1 request over the unix socket; (status, JSON body)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    s.connect(sock)
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: hull\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            break
        chunks.append(b)
    s.close()
    raw = b"".join(chunks)
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, r = b"", rest
        while r:
            n, _, r = r.partition(b"\r\n")
            n = int(n, 16)
            if n == 0:
                break
            out, r = out + r[:n], r[n + 2:]
        rest = out
    return status, (json.loads(rest) if rest.strip() else None)


def started(sock, body):
    """A session made and its first exec answered; (seconds, id)."""
    t = time.perf_counter()
    code, s = call(sock, "POST", "/v1/sessions", body)
    if code != 201:
        raise SystemExit(f"POST /v1/sessions {body}: {code} {s}")
    code, r = call(sock, "POST", f"/v1/sessions/{s['id']}/exec", {"argv": ["true"]})
    if code != 200 or r["exit_code"] != 0:
        raise SystemExit(f"exec: {code} {r}")
    return time.perf_counter() - t, s["id"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/release/hull")
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tier", default="bwrap")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hull-bench-templates-")
    project = os.path.join(work, "project")
    for i in range(args.files):
        d = os.path.join(project, f"d{i // 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.py"), "w") as f:
            f.write(f"x = {i}\n")
    sockdir = os.path.join(work, "sock")
    os.mkdir(sockdir, 0o700)
    sock = os.path.join(sockdir, "s.sock")
    env = dict(os.environ, HULL_IMAGE_CACHE=os.path.join(work, "images"))
    server = subprocess.Popen([args.hull, "serve", "--socket", sock], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        code, s = call(sock, "POST", "/v1/sessions", {"tier": args.tier, "project": project})
        assert code == 201, (code, s)
        t = time.perf_counter()
        code, m = call(sock, "POST", f"/v1/sessions/{s['id']}/template", {"name": "bench"})
        made = time.perf_counter() - t
        assert code == 201, (code, m)
        print(f"{args.tier}: template of {m['entries']} entries ({m['bytes']} bytes) made in "
              f"{made * 1000:.0f} ms")
        fork, plain = [], []
        for i in range(args.rounds):
            pair = [(fork, {"tier": args.tier, "from": "bench"}),
                    (plain, {"tier": args.tier, "project": project, "workspace": "cow"})]
            for acc, body in (pair if i % 2 == 0 else pair[::-1]):
                secs, sid = started(sock, body)
                acc.append(secs)
                call(sock, "DELETE", f"/v1/sessions/{sid}")
        print(f"{args.tier}: a session from the template, up and its first exec answered: p50 "
              f"{statistics.median(fork) * 1000:.1f} ms; a cow session on the project itself: p50 "
              f"{statistics.median(plain) * 1000:.1f} ms ({args.rounds} pairs)")
        results = []
        lock = threading.Lock()

        def one():
            r = started(sock, {"tier": args.tier, "from": "bench"})
            with lock:
                results.append(r)
        t = time.perf_counter()
        threads = [threading.Thread(target=one) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t
        print(f"{args.tier}: 4 sessions from the template at once: all up in {wall * 1000:.0f} ms "
              f"(each {', '.join(f'{r[0] * 1000:.0f}' for r in sorted(results))} ms)")
        for _, sid in results:
            call(sock, "DELETE", f"/v1/sessions/{sid}")
    finally:
        server.terminate()
        server.wait(timeout=60)
        subprocess.run([args.hull, "templates", "rm", "bench"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
