//! Files and directories only the service's own user may read: the
//! generated signing key, and the journal and snapshots (which hold
//! visitors' tickets and rooms' settings, enqueue keys among them).
//!
//! New directories get mode 0700 and new files 0600 whatever the process's
//! umask, and a file this module opens is set to 0600 even when it existed
//! before (a temporary file left by a crash, a segment from an older
//! version), so what was written with looser modes is tightened the next
//! time it is written. On other systems these are the standard library's
//! calls unchanged.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Mode of the files this module creates.
#[cfg(unix)]
pub(crate) const FILE_MODE: u32 = 0o600;
/// Mode of the directories this module creates.
#[cfg(unix)]
pub(crate) const DIR_MODE: u32 = 0o700;

/// `create_dir_all`, with every directory it creates private. An existing
/// directory keeps its mode: the operator may have chosen it.
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(DIR_MODE);
    }
    builder.create(dir)
}

/// Opens `path` with `options`, creating it private; a file that already
/// existed is made private too.
pub(crate) fn open(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(FILE_MODE);
        let file = options.open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
        Ok(file)
    }
    #[cfg(not(unix))]
    options.open(path)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn what_is_created_is_private_and_what_is_reopened_is_tightened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_dir_all(&dir).unwrap();
        assert_eq!(mode(&root.path().join("a")), DIR_MODE);
        assert_eq!(mode(&dir), DIR_MODE);
        let path = dir.join("f");
        open(OpenOptions::new().write(true).create(true), &path).unwrap();
        assert_eq!(mode(&path), FILE_MODE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(OpenOptions::new().write(true), &path).unwrap();
        assert_eq!(mode(&path), FILE_MODE);
    }
}
