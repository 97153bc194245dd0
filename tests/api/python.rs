//! Running a reference library's few lines of Python against the live
//! service: the script reads one JSON value on stdin and prints a line per
//! answer, which the test reads back.

use std::io::Write;
use std::process::{Command, Stdio};

/// The lines `script` prints given `input` on stdin; a script that fails
/// fails the test with its stderr and `hint`.
pub async fn lines(
    script: &'static str,
    input: serde_json::Value,
    hint: &'static str,
) -> Vec<String> {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{hint}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    })
    .await
    .unwrap()
}
