//! One `superinfer serve` node as a child process (the real binary), on a free port, with its
//! own data directory (kept across a restart); killed (SIGKILL) when dropped.

// Each test binary uses part of this helper.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Node {
    child: Option<Child>,
    pub base: String,
    dir: tempfile::TempDir,
}

impl Node {
    /// Starts `superinfer serve --sim-profile PROFILE --tenants-file FILE ARGS…` with `env`
    /// set, and waits until it listens.
    pub fn start(profile: &str, tenants: &Path, args: &[&str], env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (child, base) = Node::spawn(dir.path(), profile, tenants, args, env);
        Node {
            child: Some(child),
            base,
            dir,
        }
    }

    /// Starts the node again on its data directory (after [`Node::kill`]), on a new port.
    pub fn restart(&mut self, profile: &str, tenants: &Path, args: &[&str], env: &[(&str, &str)]) {
        self.kill();
        let (child, base) = Node::spawn(self.dir.path(), profile, tenants, args, env);
        self.child = Some(child);
        self.base = base;
    }

    #[allow(clippy::zombie_processes)] // `Drop for Node` kills and waits for the child.
    fn spawn(
        dir: &Path,
        profile: &str,
        tenants: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (Child, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_superinfer"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--sim-profile", profile])
            .arg("--data-dir")
            .arg(dir)
            .arg("--tenants-file")
            .arg(tenants)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("the superinfer binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("the node prints where it listens");
            if let Some(base) = line.strip_prefix("listening on ") {
                return (child, base.to_string());
            }
        }
    }

    /// kill -9: no drain, no goodbye to Redis.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}
