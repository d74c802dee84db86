#!/usr/bin/env python3
"""The network allow list per tier: time to first byte of a small GET and
the speed of a large download from inside the sandbox through hull's
proxy, against the same client going direct on the host, paired in one
run.

The client is Python's http.client (tier 3's container has Python, not
curl), in `measure.py`, which runs once per round and tier and measures
itself: N small GETs (median time from opening the connection to the
response's headers) and one large download (MiB/s), for plain HTTP
(absolute URI through the proxy) and HTTPS (CONNECT; the origin has a
self-signed certificate made for the run). Rounds alternate direct, then
the tiers in a random order. hull's own start (and tier 3's restore) is
outside what is measured.

Usage: benches/net_tiers.py [--rounds R] [--gets N] [--big-mib M] [--tiers bwrap,vm] [--hull PATH]
"""
import argparse, json, os, random, statistics, subprocess, sys

from net_origin import Handler, origins

MEASURE = r'''
import http.client, json, os, ssl, statistics, sys, time
plain, tls, gets, big = (int(a) for a in sys.argv[1:5])
proxied = bool(os.environ.get("HTTP_PROXY"))
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE

def conn(https, port):
    if proxied:
        c = (http.client.HTTPSConnection("127.0.0.1", 3128, context=ctx) if https
             else http.client.HTTPConnection("127.0.0.1", 3128))
        if https:
            c.set_tunnel("origin.test", port)
        return c, (f"http://origin.test:{port}" if not https else "")
    if https:
        return http.client.HTTPSConnection("127.0.0.1", port, context=ctx), ""
    return http.client.HTTPConnection("127.0.0.1", port), ""

def ttfb(https, port):
    t = []
    for _ in range(gets):
        t0 = time.perf_counter()
        c, prefix = conn(https, port)
        c.request("GET", prefix + "/small", headers={"Host": f"origin.test:{port}"})
        r = c.getresponse()
        t.append(time.perf_counter() - t0)
        r.read(); c.close()
    return statistics.median(t) * 1000

def speed(https, port):
    c, prefix = conn(https, port)
    t0 = time.perf_counter()
    c.request("GET", prefix + "/big", headers={"Host": f"origin.test:{port}"})
    r = c.getresponse(); n = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        n += len(b)
    dt = time.perf_counter() - t0
    c.close()
    assert n == big << 20, n
    return n / dt / (1 << 20)

print(json.dumps({"http_ttfb_ms": ttfb(False, plain), "https_ttfb_ms": ttfb(True, tls),
                  "http_mib_s": speed(False, plain), "https_mib_s": speed(True, tls)}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gets", type=int, default=20)
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--tiers", default="bwrap,vm")
    ap.add_argument("--hull", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "hull"))
    a = ap.parse_args()
    Handler.big = a.big_mib
    tmp, plain, tls, pol = origins("hull-net-tiers-")
    project = os.path.join(tmp, "project")
    os.mkdir(project)
    with open(os.path.join(project, "measure.py"), "w") as f:
        f.write(MEASURE)
    args = [str(plain), str(tls), str(a.gets), str(a.big_mib)]
    hull = os.path.abspath(a.hull)

    def run(tier):
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        if tier == "direct":
            cmd = ["/usr/bin/python3", "measure.py"] + args
        else:
            sel = ["--tier3"] if tier == "vm" else ["--tier", tier]
            cmd = [hull, "-q", "run", *sel, "--policy", pol, "--project", project,
                   "--timeout", "600s", "--", "python3", "measure.py"] + args
        r = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:
            sys.exit(f"{tier}: exit {r.returncode}: {r.stderr[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    tiers = [t for t in a.tiers.split(",") if t]
    results = {t: [] for t in ["direct"] + tiers}
    for t in ["direct"] + tiers:  # warm-up (tier 3: the snapshot)
        run(t)
    for _ in range(a.rounds):
        order = tiers[:]
        random.shuffle(order)
        for t in ["direct"] + order:
            results[t].append(run(t))
    print(f"hull {hull}; {a.rounds} rounds; per round {a.gets} GETs (median) and one {a.big_mib} MiB download each way\n")
    keys = [("http_ttfb_ms", "http GET, time to first byte", "ms"),
            ("https_ttfb_ms", "https GET, time to first byte", "ms"),
            ("http_mib_s", f"http {a.big_mib} MiB download", "MiB/s"),
            ("https_mib_s", f"https {a.big_mib} MiB download", "MiB/s")]
    for k, name, unit in keys:
        d = statistics.median(r[k] for r in results["direct"])
        row = f"{name:32} direct {d:9.2f} {unit}"
        for t in tiers:
            v = statistics.median(r[k] for r in results[t])
            row += f" | {t} {v:9.2f} ({v / d:5.2f}x)"
        print(row)


if __name__ == "__main__":
    main()
