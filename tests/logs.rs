//! The `narabu` binary's logs: with `log_format = "json"` every line is a
//! JSON object, an operator's change is logged inside its request's span
//! with the request id the client got back, and the admin token never
//! appears.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const TOKEN: &str = "logs-admin-token-logs-admin-token-0123456";

#[tokio::test]
async fn json_logs_carry_request_ids_and_no_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("narabu.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\nadmin_token = \"{TOKEN}\"\n\n[[rooms]]\nid = \"sale\"\ncapacity = 5\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_narabu"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NARABU_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let base = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server starts");
        lines.push(line.clone());
        if let Some(url) = line.strip_prefix("narabu listening on ") {
            break url.to_owned();
        }
        assert!(Instant::now() < deadline);
    };

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
    let config = dir.path().join("narabu.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[[rooms]]\nid = \"sale\"\ncapacity = 5\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_narabu"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NARABU_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
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
        let config = dir.path().join(format!("{algorithm}.toml"));
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nadmin_token = \"{TOKEN}\"\n\
                 pass_algorithm = \"{algorithm}\"\npass_key_file = \"{}\"\n\n\
                 [[rooms]]\nid = \"sale\"\ncapacity = 5\n",
                dir.path().join("data").display(),
                key_path.display()
            ),
        )
        .unwrap();
        config
    };

    let mut child = Command::new(env!("CARGO_BIN_EXE_narabu"))
        .args(["serve", "--config"])
        .arg(write_config("ES256"))
        .env("NARABU_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    let mut lines = Vec::new();
    let base = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server starts");
        lines.push(line.clone());
        if let Some(url) = line.strip_prefix("narabu listening on ") {
            break url.to_owned();
        }
    };
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
