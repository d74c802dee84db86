#!/usr/bin/env python3
"""Landlock runs in a project with and without its own `.hull`, two hull
builds interleaved (four projects, shuffled each round), medians.

  TMPDIR=/var/tmp python3 benches/landlock_pool.py NEW_HULL OLD_HULL [ROUNDS]
"""
import subprocess,time,statistics,os,random,sys,tempfile
new,old=sys.argv[1],sys.argv[2]
env=dict(os.environ,HULL_RUNS_DIR=tempfile.mkdtemp(prefix="pair-runs-"))
projs={}
for name in ["new-nohull","new-hull","old-nohull","old-hull"]:
    d=tempfile.mkdtemp(prefix=name+"-")
    if name.endswith("-hull"): os.mkdir(d+"/.hull")
    projs[name]=d
bins={"new":new,"old":old}
def run(name):
    b=bins[name.split("-")[0]]
    t=time.perf_counter()
    subprocess.run([b,"run","--tier","landlock","--","true"],cwd=projs[name],env=env,check=True,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    return (time.perf_counter()-t)*1000
t={k:[] for k in projs}
for _ in range(2):
    for k in projs: run(k)
for _ in range(int(sys.argv[3]) if len(sys.argv)>3 else 30):
    ks=list(projs); random.shuffle(ks)
    for k in ks: t[k].append(run(k))
for k in projs: print(f"{k:11} median {statistics.median(t[k]):7.2f} ms  (p25 {statistics.quantiles(t[k],n=4)[0]:.2f}, p75 {statistics.quantiles(t[k],n=4)[2]:.2f})")
