#!/usr/bin/env python3
"""The session API's cost over `hull run`: the same `true` as one `hull
run --tier T` and as one exec in a `hull serve` session on T (shared and
copy-on-write workspaces), interleaved one by one, N times each.

  true p50:       the plain `true`, process start to exit (the command's
                  own cost, which an exec adds to)
  run p50:        `hull run --tier T -- true`, process start to exit
  exec p50:       POST /v1/sessions/ID/exec {"argv": ["true"]}, request to
                  answer (on landlock and bwrap the session's one sandbox
                  runs it; on vm its kept VM)
  cow exec p50:   the same in a copy-on-write session (each exec continues
                  the session's change set)

Usage: benches/serve.py [--hull PATH] [--tier landlock|bwrap|vm] [-n N]
"""
import argparse, http.client, json, os, shutil, signal, socket, statistics, subprocess, tempfile, time


class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("hull")
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path_)


def call(sock, method, path, doc=None):
    c = Unix(sock)
    c.request(method, path, body=None if doc is None else json.dumps(doc).encode(),
              headers={"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status >= 400:
        raise SystemExit(f"{method} {path}: {r.status} {data!r}")
    return json.loads(data) if data else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/debug/hull")
    ap.add_argument("--tier", default="bwrap")
    ap.add_argument("-n", type=int, default=30)
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    scratch = tempfile.mkdtemp(prefix="hull-bench-serve-")
    proj = os.path.join(scratch, "project")
    os.makedirs(proj)
    sock = os.path.join(scratch, "s", "serve.sock")
    env = dict(os.environ, HULL_CHANGES_DIR=os.path.join(scratch, "changes"))
    server = subprocess.Popen([hull, "serve", "--socket", sock], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(sock):
            time.sleep(0.02)
        time.sleep(0.1)
        shared = call(sock, "POST", "/v1/sessions", {"tier": a.tier, "project": proj})["id"]
        cow = call(sock, "POST", "/v1/sessions",
                   {"tier": a.tier, "project": proj, "workspace": "cow"})["id"]
        times = {"true": [], "run": [], "exec": [], "cow exec": []}
        for _ in range(a.n):
            t = time.monotonic()
            subprocess.run(["true"], check=True, stdin=subprocess.DEVNULL)
            times["true"].append(time.monotonic() - t)
            t = time.monotonic()
            subprocess.run([hull, "run", "-q", "--tier", a.tier, "--project", proj, "--", "true"],
                           env=env, check=True, stdin=subprocess.DEVNULL)
            times["run"].append(time.monotonic() - t)
            for key, sid in (("exec", shared), ("cow exec", cow)):
                t = time.monotonic()
                r = call(sock, "POST", f"/v1/sessions/{sid}/exec", {"argv": ["true"]})
                times[key].append(time.monotonic() - t)
                assert r["exit_code"] == 0, r
        base = statistics.median(times["run"])
        plain = statistics.median(times["true"])
        print(f"tier {a.tier}, {a.n} of each, interleaved")
        for key, v in times.items():
            m = statistics.median(v)
            print(f"  {key:<9} p50 {m * 1000:7.1f} ms  (min {min(v) * 1000:.1f}, max {max(v) * 1000:.1f})"
                  f"  {m / base:.2f}x run, +{(m - plain) * 1000:.1f} ms over true")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
