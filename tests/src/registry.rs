//! A container registry of the test's own on loopback: Debian's
//! `docker-registry` (the distribution project's), its storage in a
//! directory of the test's, optionally behind a user and password
//! (htpasswd), stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = "/usr/bin/docker-registry";

#[derive(Debug)]
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub host: String,
    pub port: u16,
    /// Where it keeps its blobs (`docker/registry/v2/blobs/sha256/..`).
    pub storage: PathBuf,
}

impl Registry {
    /// Starts one in `dir`; with `login`, only that user and password may
    /// pull or push. Fails with a message when the registry is not
    /// installed (`scripts/setup.sh --test` installs it).
    pub fn start(dir: &Path, login: Option<(&str, &str)>) -> Registry {
        assert!(
            Path::new(BINARY).exists(),
            "{BINARY} is missing: `scripts/setup.sh --test` installs docker-registry"
        );
        let storage = dir.join("registry-data");
        std::fs::create_dir_all(&storage).expect("registry storage");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        );
        if let Some((user, password)) = login {
            let out = Command::new("python3")
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt, sys; print(sys.argv[1] + ':' + crypt.crypt(sys.argv[2], \
                     crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                    user,
                    password,
                ])
                .output()
                .expect("python3 crypt");
            assert!(out.status.success(), "{}", crate::show(&out));
            let file = dir.join("htpasswd");
            std::fs::write(&file, &out.stdout).expect("htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: hull-tests\n    path: {}\n",
                file.display()
            ));
        }
        let config_file = dir.join("registry.yml");
        std::fs::write(&config_file, config).expect("registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("registry log");
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let host = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {host} within 20 s: {}",
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            host,
            port,
            storage,
        }
    }

    /// The file of the blob `digest` (`sha256:HEX`) in its storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
