//! The `narabu` binary's logs: with `log_format = "json"` every line is a
//! JSON object, an operator's change is logged inside its request's span
//! with the request id the client got back, and the admin token never
//! appears; plain logs into a pipe carry no colour codes; a configured
//! pass signing key never shows anywhere.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const TOKEN: &str = "logs-admin-token-logs-admin-token-0123456";

/// A config file in `dir`: a free port, a data directory, `extra` settings
/// and one room.
fn config_file(dir: &std::path::Path, name: &str, extra: &str) -> std::path::PathBuf {
    let config = dir.join(name);
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{extra}\n[[rooms]]\nid = \"sale\"\ncapacity = 5\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    config
}

/// `narabu serve` at `level`, its standard output (and its standard error
/// with `stderr`) read line by line into a channel.
fn serve(config: &std::path::Path, level: &str, stderr: bool) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_narabu"))
        .args(["serve", "--config"])
        .arg(config)
        .env("NARABU_LOG", level)
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(if stderr {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let mut pipes: Vec<Box<dyn std::io::Read + Send>> =
        vec![Box::new(child.stdout.take().unwrap())];
    if let Some(err) = child.stderr.take() {
        pipes.push(Box::new(err));
    }
    for pipe in pipes {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    (child, rx)
}

/// Lines until the one that says where it listens, and its address.
fn listening(rx: &mpsc::Receiver<String>, lines: &mut Vec<String>) -> String {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server starts");
        lines.push(line.clone());
        if let Some(url) = line.strip_prefix("narabu listening on ") {
            return url.to_owned();
        }
    }
}

#[tokio::test]
async fn json_logs_carry_request_ids_and_no_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "narabu.toml",
        &format!("log_format = \"json\"\nadmin_token = \"{TOKEN}\"\n"),
    );
    let (mut child, rx) = serve(&config, "info", false);
    let mut lines = Vec::new();
    let base = listening(&rx, &mut lines);

    let response = reqwest::Client::new()
        .patch(format!("{base}/admin/rooms/sale"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"capacity": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();

    let mut found = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while found.is_none() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(line.clone());
            if line.contains("admin: room changed") {
                found = Some(line);
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();

    let line = found.unwrap_or_else(|| panic!("no admin log line in {lines:#?}"));
    let entry: Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(entry["fields"]["message"], "admin: room changed");
    assert_eq!(entry["fields"]["capacity"], 3);
    assert_eq!(entry["fields"]["previous_capacity"], 5);
    assert_eq!(entry["span"]["request_id"], request_id.as_str(), "{line}");
    for line in &lines {
        assert!(!line.contains(TOKEN), "a secret in the logs: {line}");
        if !line.starts_with("narabu listening on ") {
            serde_json::from_str::<Value>(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        }
    }
}

/// Plain logs written to a pipe (or a file, or a journal) carry no colour
/// codes, which would otherwise turn up as `\x1b[2m` in every line.
#[test]
fn plain_logs_into_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, rx) = serve(&config_file(dir.path(), "narabu.toml", ""), "info", false);
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        let served = line.contains("narabu is serving");
        lines.push(line);
        if served {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("narabu is serving")),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a pipe: {lines:?}"
    );
}

/// A configured pass signing key never shows: not in the logs (at debug),
/// not in the admin API, not in the published keys, not in the error of a
/// start-up that refuses it.
#[tokio::test]
async fn the_pass_signing_key_never_shows() {
    use p256::pkcs8::{EncodePrivateKey, LineEnding};
    let dir = tempfile::tempdir().unwrap();
    let key = p256::SecretKey::from_slice(&[0x42; 32]).unwrap();
    let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
    let key_path = dir.path().join("pass.pem");
    std::fs::write(&key_path, pem.as_bytes()).unwrap();
    // Every line of the key's body, and the scalar itself.
    let mut secret_parts: Vec<String> = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_owned)
        .collect();
    secret_parts.push(hex::encode([0x42; 32]));
    let write_config = |algorithm: &str| {
        config_file(
            dir.path(),
            &format!("{algorithm}.toml"),
            &format!(
                "admin_token = \"{TOKEN}\"\npass_algorithm = \"{algorithm}\"\npass_key_file = \"{}\"\n",
                key_path.display()
            ),
        )
    };

    let (mut child, rx) = serve(&write_config("ES256"), "debug", true);
    let mut lines = Vec::new();
    let base = listening(&rx, &mut lines);
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for path in [
        "/admin/rooms",
        "/admin/rooms/sale",
        "/.well-known/jwks.json",
        "/.well-known/narabu-pass.pem",
        "/gate/sale?pass=1",
    ] {
        let response = client
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        answers.push(format!("{path}: {}", response.text().await.unwrap()));
    }
    let jwks: Value = serde_json::from_str(answers[2].split_once(": ").unwrap().1).unwrap();
    assert!(jwks["keys"][0]["kid"].is_string(), "{jwks}");
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
        lines.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    for text in lines.iter().chain(&answers) {
        for part in &secret_parts {
            assert!(!text.contains(part.as_str()), "the pass key shows: {text}");
        }
    }

    // A key of the wrong algorithm stops the start, naming the file only.
    let out = Command::new(env!("CARGO_BIN_EXE_narabu"))
        .args(["serve", "--config"])
        .arg(write_config("EdDSA"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&key_path.display().to_string()), "{stderr}");
    for part in &secret_parts {
        assert!(
            !stderr.contains(part.as_str()),
            "the pass key shows: {stderr}"
        );
    }
}
