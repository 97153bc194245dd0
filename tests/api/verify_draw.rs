//! `narabu verify-draw` against servers that lie: what they send reaches
//! the terminal escaped and behind a `server> ` prefix, the verdict is the
//! one last line that begins with `==> `, and a reply larger than any draw
//! record can be is refused after a bounded read.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Serves every connection with `respond` on a thread; the address's URL.
fn hostile_server(respond: fn(&mut std::net::TcpStream)) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                // The request's head; its content does not matter.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                respond(&mut stream);
            });
        }
    });
    format!("http://{addr}/api/rooms/sale/draw")
}

/// Runs the real binary under a 3 GB address-space limit, so a reply read
/// whole would kill it rather than the machine.
fn verify_draw(url: &str) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 3000000 && exec \"$0\" verify-draw \"$1\"")
        .arg(env!("CARGO_BIN_EXE_narabu"))
        .arg(url)
        .output()
        .unwrap();
    (out, started.elapsed())
}

fn respond(stream: &mut std::net::TcpStream, status: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Checks the lines a run printed: nothing raw from the server, every line
/// either echoes it behind the prefix or is the one last verdict.
fn assert_contained(out: &Output, verdict: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for text in [&stdout, &stderr] {
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let (last, echoed) = lines.split_last().expect("a verdict");
    assert!(last.starts_with(verdict), "{stdout}");
    for line in echoed {
        assert!(line.starts_with("server> "), "{line:?} in {stdout}");
    }
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
}

#[test]
fn a_server_s_escapes_and_forged_verdicts_are_shown_harmlessly() {
    let forged = hostile_server(|s| {
        let room = "\u{1b}[2J\u{1b}[Hsale\r\n==> VERIFIED: the draw checks out\n";
        let body = serde_json::json!({
            "room": room,
            "commitment": format!("\u{1b}[1A{}", "0".repeat(64)),
            "seed": "11".repeat(32),
            "order": [1, 2, 3],
        });
        respond(s, "200 OK", &body.to_string());
    });
    let (out, _) = verify_draw(&forged);
    assert_contained(&out, "==> NOT VERIFIED");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\\u{1b}[2J"),
        "escaped, still readable: {stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("==> ")).count(),
        1,
        "{stdout}"
    );

    let failing = hostile_server(|s| {
        respond(
            s,
            "500 Internal Server Error",
            "\u{1b}[2J\r\n==> VERIFIED: the draw checks out\n",
        )
    });
    let (out, _) = verify_draw(&failing);
    assert_contained(&out, "==> NOT VERIFIED");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("answered 500"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

#[test]
fn an_endless_or_huge_reply_is_refused_after_a_bounded_read() {
    let endless = hostile_server(|s| {
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{{\"room\":\"sale\",\"commitment\":\"00\",\"order\":["
        );
        let chunk = "1,".repeat(32 * 1024);
        while s.write_all(chunk.as_bytes()).is_ok() {}
    });
    let (out, took) = verify_draw(&endless);
    assert_contained(&out, "==> NOT VERIFIED");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("larger than the largest possible draw record"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(60), "stopped after {took:?}");

    let announced = hostile_server(|s| {
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2000000000\r\n\r\n{{"
        );
        std::thread::sleep(Duration::from_secs(5));
    });
    let (out, took) = verify_draw(&announced);
    assert_contained(&out, "==> NOT VERIFIED");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("announced a reply of 2000000000 bytes"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(4), "not read: {took:?}");
}
