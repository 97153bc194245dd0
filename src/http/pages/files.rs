//! Reading an operator's page and message files without trusting what the
//! directory holds.
//!
//! Whoever can write a template directory is not meant to be able to read
//! the service's secrets or exhaust its memory through it. So a file is
//! opened with `O_NOFOLLOW` (a symbolic link to the signing key is refused,
//! not followed), must be a regular file by the opened handle's own
//! metadata (a FIFO or `/dev/zero` is refused before any read; the open is
//! non-blocking so a FIFO without a writer cannot hang the load), and is
//! read through a hard byte cap whatever its size claimed to be (a file
//! that grows while read cannot get past the cap either). Errors name
//! files relative to their directory: the absolute path of the server's
//! files is nobody's business in an admin reply or a log line.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::templates::PageError;

/// Reads `path` (shown as `shown`) as UTF-8 text of at most `cap` bytes.
pub(crate) fn read_text(path: &Path, shown: &str, cap: u64) -> Result<String, PageError> {
    let file = open(path, shown)?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| PageError::new(shown, None, format!("cannot read it: {}", io_reason(&e))))?;
    if bytes.len() as u64 > cap {
        return Err(too_large(shown, cap));
    }
    String::from_utf8(bytes)
        .map_err(|_| PageError::new(shown, None, "cannot read it as UTF-8 text"))
}

fn open(path: &Path, shown: &str) -> Result<File, PageError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                PageError::new(shown, None, symlink_reason())
            } else {
                PageError::new(shown, None, format!("cannot open it: {}", io_reason(&e)))
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|e| PageError::new(shown, None, format!("cannot read it: {}", io_reason(&e))))?;
    if !meta.is_file() {
        return Err(PageError::new(shown, None, "is not a regular file"));
    }
    Ok(file)
}

pub(crate) fn symlink_reason() -> &'static str {
    "is a symbolic link; templates and message files must be regular files in the directory"
}

pub(crate) fn too_large(shown: &str, cap: u64) -> PageError {
    PageError::new(shown, None, format!("is larger than {} KiB", cap / 1024))
}

/// An I/O error's words without the path some errors carry: the kind
/// (and OS code) only.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => format!("{} (os error {code})", e.kind()),
        None => e.kind().to_string(),
    }
}

/// Whether `path` itself (not what it points to) is a symbolic link.
pub(crate) fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_links_devices_fifos_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.html");
        std::fs::write(&ok, "hello").unwrap();
        assert_eq!(read_text(&ok, "ok.html", 10).unwrap(), "hello");

        let big = dir.path().join("big.html");
        std::fs::write(&big, "x".repeat(11)).unwrap();
        let e = read_text(&big, "big.html", 10).unwrap_err();
        assert!(e.reason.contains("larger"), "{e}");

        let link = dir.path().join("link.html");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        let e = read_text(&link, "link.html", 10).unwrap_err();
        assert!(e.reason.contains("symbolic link"), "{e}");

        let e = read_text(Path::new("/dev/zero"), "zero.html", 10).unwrap_err();
        assert!(e.reason.contains("not a regular file"), "{e}");

        let fifo = dir.path().join("fifo.html");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let e = read_text(&fifo, "fifo.html", 10).unwrap_err();
        assert!(e.reason.contains("not a regular file"), "{e}");
    }
}
