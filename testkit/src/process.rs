//! A Narabu process of its own, started from the binary the tests built,
//! for what only a real process shows (a SIGKILL leaves no chance to hand
//! anything over). Its output goes to a log file the test can read.

use std::path::Path;
use std::process::{Child, Command};

use crate::redis_server::free_port;

/// A `narabu serve` process on a free loopback port; killed with SIGKILL
/// on drop.
pub struct NarabuProcess {
    child: Child,
    pub base: String,
    dir: tempfile::TempDir,
}

impl NarabuProcess {
    /// Start `binary` (the test's `env!("CARGO_BIN_EXE_narabu")`) with a
    /// configuration of `listen` and `data_dir` (filled in here) and then
    /// `config`, logging at `info`.
    pub fn start(binary: &Path, config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let file = dir.path().join("narabu.toml");
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n{config}",
                dir.path().display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(&file)
            .env("NARABU_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NarabuProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
