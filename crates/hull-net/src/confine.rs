//! The proxy's own process, confined before it serves anything (defence in
//! depth: it parses what the command sends).
//!
//! With Landlock (best effort: what the kernel supports): file access is
//! read-only and limited to what name resolution needs (`/etc`, the system
//! libraries NSS loads), nothing is executed, no TCP port is bound, and TCP
//! connects go only to the policy's ports (and 53, DNS over TCP); signals
//! and abstract unix sockets are scoped to the process. A proxy taken over
//! through a parser bug can then still reach the ports the policy allows,
//! but not read the host's files, start programs or listen.
//!
//! Landlock binds the calling thread and the threads it starts later, so
//! this runs before the proxy's runtime starts any thread.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::policy::NetPolicy;

/// Directories the proxy may read: name resolution's configuration and the
/// libraries NSS loads.
const READABLE: &[&str] = &["/etc", "/usr", "/lib", "/lib64", "/lib32"];

/// How the confinement went.
#[derive(Debug, PartialEq, Eq)]
pub enum Confined {
    Fully,
    Partially,
    /// The kernel has no Landlock: the proxy runs with its uid's rights.
    No,
}

/// Confines the calling thread (and every thread it starts afterwards).
pub fn apply(policy: &NetPolicy) -> Result<Confined, landlock::RulesetError> {
    let abi = ABI::V6;
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?;
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    for dir in READABLE {
        // A directory this system lacks grants nothing.
        if let Ok(fd) = PathFd::new(dir) {
            created = created.add_rule(PathBeneath::new(fd, read))?;
        }
    }
    let mut ports: Vec<u16> = policy.ports.clone();
    ports.push(53);
    ports.sort_unstable();
    ports.dedup();
    for port in ports {
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Confined::Fully,
        RulesetStatus::PartiallyEnforced => Confined::Partially,
        RulesetStatus::NotEnforced => Confined::No,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own (Landlock binds the thread that restricts
    /// itself and those it starts): the confinement refuses reading outside
    /// the resolver's files, binding, and connecting to a port the policy
    /// does not allow; what the proxy needs still works. The same calls
    /// succeed before it (the control).
    #[test]
    fn a_confined_proxy_reads_binds_and_connects_only_what_it_needs() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, o) = (allowed.local_addr().unwrap(), other.local_addr().unwrap());
        let policy = NetPolicy {
            ports: vec![a.port()],
            ..NetPolicy::default()
        };
        let probe = move || {
            (
                std::fs::read(&secret).is_ok(),
                std::fs::read("/etc/hosts").is_ok(),
                std::net::TcpListener::bind("127.0.0.1:0").is_ok(),
                std::net::TcpStream::connect(a).is_ok(),
                std::net::TcpStream::connect(o).is_ok(),
            )
        };
        let before = probe.clone()();
        assert_eq!(before, (true, true, true, true, true), "control");
        let after = std::thread::spawn(move || {
            let how = apply(&policy).unwrap();
            (how, probe())
        })
        .join()
        .unwrap();
        if after.0 == Confined::No {
            panic!("this kernel has no Landlock: the confinement cannot be checked here");
        }
        assert_eq!(after.1, (false, true, false, true, false), "{:?}", after.0);
    }
}
