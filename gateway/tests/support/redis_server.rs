//! A real `redis-server` (the Debian package) on a free loopback port, for the tests of the
//! fleet's quota store. It keeps nothing on disk and is killed when dropped. Without
//! `redis-server` on PATH the test fails (it does not skip): `.ci/run` installs it.

// Each test binary uses part of this helper.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_on(free_port())
    }

    /// Starts on `port` and waits until it answers PING.
    pub fn start_on(port: u16) -> RedisServer {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-server ({e}); this test needs it: apt-get install -y \
                     redis-server (.ci/run installs it)"
                )
            });
        let server = RedisServer {
            child: Some(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.ping() {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer in 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut c).is_ok()
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`) to the server.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {signal} {pid}");
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
