//! The shipped systemd unit (`config/narabu.service`) is one systemd
//! accepts, and its hardening holds: `systemd-analyze verify` reads it
//! (with its `ExecStart` pointed at this build of the binary, which must
//! exist), and `systemd-analyze security --offline` rates its exposure
//! at 2.0 or less on systemd's 0–10 scale.

use std::process::Command;

/// The unit as shipped, with the binary this test built in its place.
fn unit_here(dir: &std::path::Path) -> std::path::PathBuf {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/narabu.service"
    ))
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/narabu serve"));
    let unit = unit.replace("/usr/local/bin/narabu", env!("CARGO_BIN_EXE_narabu"));
    let path = dir.join("narabu.service");
    std::fs::write(&path, unit).unwrap();
    path
}

fn analyze(args: &[&str], unit: &std::path::Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .output()
        .expect("systemd-analyze runs (scripts/test installs systemd)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_unit_verifies_and_its_exposure_is_low() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_here(dir.path());
    let (ok, text) = analyze(&["verify"], &unit);
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify: {text}"
    );
    let (ok, text) = analyze(&["security", "--offline=true", "--threshold=20"], &unit);
    assert!(ok, "exposure above 2.0: {text}");
    assert!(text.contains("Overall exposure level"), "{text}");
}
