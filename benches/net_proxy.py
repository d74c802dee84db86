#!/usr/bin/env python3
"""hull's egress proxy against a direct connection, on loopback, paired in
one run: time to first byte of a small GET (median of N pairs, curl's
time_starttransfer) and the throughput of a large download (median of R
pairs), for plain HTTP (absolute URI) and HTTPS (CONNECT; the origin has a
self-signed certificate made for the run with openssl, curl -k).

The proxy is `hull __net-proxy` with a policy allowing one name, fixed to
127.0.0.1 by `hosts` and `allow_private`.

With --tier bwrap (or landlock) the proxied side is curl run inside `hull
run --tier bwrap` with the same policy (to the proxy's listener in the
command's network namespace; curl's own timings, not hull's start-up).

Usage: benches/net_proxy.py [--rounds N] [--big-mib M] [--big-rounds R] [--hull PATH] [--tier bwrap|landlock]
"""
import argparse, os, random, statistics, subprocess, sys

from net_origin import Handler, origins

WRAP = []

def curl(args, metric):
    wrap = WRAP if args and args[0] == "@sandbox" else []
    args = args[1:] if wrap else args
    r = subprocess.run(wrap + ["curl", "-sS", "-k", "-o", "/dev/null", "-w", f"%{{{metric}}}"] + args,
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()})
    if r.returncode != 0:
        sys.exit(f"curl failed: {' '.join(args)}: {r.stderr}")
    return float(r.stdout)

def paired(name, direct, proxied, rounds, metric, unit, scale):
    d, p = [], []
    for _ in range(2):
        curl(direct, metric); curl(proxied, metric)
    for _ in range(rounds):
        if random.random() < 0.5:
            d.append(curl(direct, metric)); p.append(curl(proxied, metric))
        else:
            p.append(curl(proxied, metric)); d.append(curl(direct, metric))
    md, mp = statistics.median(d) * scale, statistics.median(p) * scale
    print(f"{name:28} direct {md:9.2f} {unit} | proxy {mp:9.2f} {unit} | "
          f"difference {mp - md:+9.2f} {unit} | ratio {mp / md:5.2f}  (n={rounds} pairs)")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--big-rounds", type=int, default=5)
    ap.add_argument("--hull", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "hull"))
    ap.add_argument("--tier", choices=["bwrap", "landlock"], default=None)
    a = ap.parse_args()
    Handler.big = a.big_mib
    tmp, plain, tls, pol = origins("hull-net-bench-")
    if a.tier:
        project = os.path.join(tmp, "project")
        os.mkdir(project)
        WRAP.extend([os.path.abspath(a.hull), "-q", "run", "--tier", a.tier, "--policy", pol,
                     "--project", project, "--timeout", "120s", "--"])
    proxy = subprocess.Popen([os.path.abspath(a.hull), "__net-proxy", "--policy", pol],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proxy.stdout.readline().split()
    if not line or line[0] != "listening":
        sys.exit(f"the proxy did not start: {line}")
    px = ["@sandbox"] if a.tier else ["-x", f"http://{line[1]}", "--resolve", f"origin.test:{tls}:127.0.0.1"]
    print(f"hull {os.path.abspath(a.hull)}, proxied: {'curl in hull run --tier ' + a.tier if a.tier else 'proxy ' + line[1]}, origin :{plain} (http) :{tls} (https)\n")
    paired("http GET, time to first byte", [f"http://127.0.0.1:{plain}/small"],
           px + [f"http://origin.test:{plain}/small"], a.rounds, "time_starttransfer", "ms", 1000)
    paired("https GET, time to first byte", ["--resolve", f"origin.test:{tls}:127.0.0.1", f"https://origin.test:{tls}/small"],
           px + [f"https://origin.test:{tls}/small"], a.rounds, "time_starttransfer", "ms", 1000)
    paired(f"http {a.big_mib} MiB download", [f"http://127.0.0.1:{plain}/big"],
           px + [f"http://origin.test:{plain}/big"], a.big_rounds, "speed_download", "MiB/s", 1 / (1 << 20))
    paired(f"https {a.big_mib} MiB download", ["--resolve", f"origin.test:{tls}:127.0.0.1", f"https://origin.test:{tls}/big"],
           px + [f"https://origin.test:{tls}/big"], a.big_rounds, "speed_download", "MiB/s", 1 / (1 << 20))
    proxy.stdin.close()
    proxy.wait(timeout=10)

if __name__ == "__main__":
    main()
