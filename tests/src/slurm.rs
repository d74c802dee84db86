//! A Slurm cluster of one node for a test: munged, slurmctld and slurmd
//! from Debian's packages (`scripts/setup.sh --test` installs them), each
//! started in the foreground with its state, spool, logs, key and sockets
//! in a scratch directory and ports picked free on loopback, and killed when
//! the cluster is dropped. Clients (`sbatch`, `sinfo`) reach it through
//! [`Cluster::client`], which sets `SLURM_CONF`.
//!
//! Jobs run as the submitting user: slurmd switches to that user, which
//! needs root (`SlurmdUser=root`), so the cluster is for tests run as root.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The daemons and clients a cluster needs, each with the package that
/// brings it.
const PROGRAMS: [(&str, &str); 5] = [
    ("munged", "munge"),
    ("slurmctld", "slurmctld"),
    ("slurmd", "slurmd"),
    ("sbatch", "slurm-client"),
    ("sinfo", "slurm-client"),
];

/// The node's name (slurmd is started as it, whatever the host is called).
const NODE: &str = "hullnode";

#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
}

fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on loopback")
        .port()
}

fn short_hostname() -> String {
    let o = Command::new("uname").arg("-n").output().expect("uname -n");
    let name = String::from_utf8(o.stdout).expect("hostname is UTF-8");
    name.trim().split('.').next().unwrap_or_default().to_owned()
}

impl Cluster {
    /// Starts the cluster under `dir` (which must exist and be short
    /// enough for a unix socket path) and waits until its node is idle.
    /// Fails naming the missing program and its package, or the daemon that
    /// did not come up with the end of its log.
    pub fn start(dir: &Path) -> Cluster {
        for (program, package) in PROGRAMS {
            assert!(
                find(program).is_some(),
                "{program} is not installed (Debian package {package}): \
                 scripts/setup.sh --test installs the Slurm daemons and clients"
            );
        }
        assert!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() } == 0,
            "a local Slurm cluster needs root: slurmd runs each job as its user"
        );
        for d in ["state", "spool", "log", "munge"] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        let key = dir.join("munge/key");
        let mut bytes = vec![0u8; 1024];
        let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
        std::io::Read::read_exact(&mut f, &mut bytes).expect("read /dev/urandom");
        std::fs::write(&key, bytes).expect("write munge key");
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path, m| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
            };
            mode(&key, 0o400);
            // munged serves clients only from a socket every user can reach.
            mode(&dir.join("munge"), 0o755);
        }
        let socket = dir.join("munge/socket");
        let conf = dir.join("slurm.conf");
        let p = |s: &str| dir.join(s).display().to_string();
        let text = format!(
            "ClusterName=hulltest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={socket}\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\n\
             SlurmdPidFile={slurmd_pid}\n\
             SlurmctldLogFile={ctld_log}\n\
             SlurmdLogFile={slurmd_log}\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
             PartitionName=hulltest Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n",
            host = short_hostname(),
            ctld_port = free_port(),
            slurmd_port = free_port(),
            socket = socket.display(),
            state = p("state"),
            spool = p("spool"),
            ctld_pid = p("slurmctld.pid"),
            slurmd_pid = p("slurmd.pid"),
            ctld_log = p("log/slurmctld.log"),
            slurmd_log = p("log/slurmd.log"),
            cpus = std::thread::available_parallelism().map_or(1, |n| n.get()),
        );
        std::fs::write(&conf, text).expect("write slurm.conf");
        let mut cluster = Cluster {
            dir: dir.to_owned(),
            conf,
            daemons: Vec::new(),
        };
        let m = |s: &str| dir.join("munge").join(s).display().to_string();
        cluster.spawn(
            "munged",
            &[
                "--foreground",
                // munged refuses to run as root unless forced.
                "--force",
                &format!("--key-file={}", key.display()),
                &format!("--socket={}", socket.display()),
                &format!("--pid-file={}", m("pid")),
                &format!("--log-file={}", m("log")),
                &format!("--seed-file={}", m("seed")),
            ],
        );
        cluster.wait_for("munged", || socket.exists());
        let conf = cluster.conf.display().to_string();
        cluster.spawn("slurmctld", &["-D", "-f", &conf]);
        cluster.spawn("slurmd", &["-D", "-f", &conf, "-N", NODE]);
        let sinfo = find("sinfo").expect("checked above");
        let conf = cluster.conf.clone();
        cluster.wait_for("slurmd", || {
            Command::new(&sinfo)
                .env("SLURM_CONF", &conf)
                .args(["-h", "-N", "-o", "%T"])
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        cluster
    }

    fn spawn(&mut self, name: &'static str, args: &[&str]) {
        let out = std::fs::File::create(self.dir.join(format!("log/{name}.out")))
            .expect("create daemon output");
        let err = out.try_clone().expect("dup");
        let child = Command::new(find(name).expect("checked above"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.daemons.push((name, child));
    }

    /// Waits up to 30 s for `ready`; fails with every daemon's output if a
    /// daemon exited or the time ran out.
    fn wait_for(&mut self, what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ready() {
                return;
            }
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|(n, c)| c.try_wait().ok().flatten().map(|st| format!("{n} {st}")));
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "the local Slurm cluster did not come up ({what} not ready{}):\n{}",
                    exited.map_or(String::new(), |e| format!("; {e}")),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The end of every daemon's output and log, for a failure message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for f in [
            "log/munged.out",
            "munge/log",
            "log/slurmctld.out",
            "log/slurmctld.log",
            "log/slurmd.out",
            "log/slurmd.log",
        ] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s.push_str(&format!("--- {f}\n"));
            for l in tail.iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }

    /// A Slurm client (`sbatch`, `sinfo`, ...) talking to this cluster.
    pub fn client(&self, program: &str) -> Command {
        let mut c = Command::new(find(program).expect("checked in start"));
        c.env("SLURM_CONF", &self.conf);
        c
    }
}

impl Drop for Cluster {
    /// Stops the daemons as their service would (SIGTERM, so that each
    /// reaps its helpers), then kills what is left after 5 s.
    fn drop(&mut self) {
        for (_, child) in &self.daemons {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill has no memory preconditions; pid is our
                // child, not yet waited for, so it names no other process.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, child) in &mut self.daemons {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
