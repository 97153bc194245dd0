//! The bytes on disk: journal segments and snapshots.
//!
//! A segment is `NARABUJ5`, the sequence number of its first record (u64
//! LE), then frames. A frame is `len u32 LE | crc32c(payload) u32 LE |
//! crc32c(first 8 bytes) u32 LE | payload` (postcard). The header has its
//! own checksum so that a damaged length is caught as damage, not mistaken
//! for a record that runs past the end of the file.
//!
//! Reading tells a torn tail from damage: a write cut short by a crash or
//! power cut can only leave a partial frame (or zeros) at the very end of
//! the newest segment, while a bad checksum with more frames after it means
//! the file was damaged after it was written. The first is dropped with a
//! warning naming the offset; the second stops start-up.
//!
//! A snapshot is `NARABUS5`, the sequence number it covers up to, and one
//! frame.
//!
//! The digit is the format's version: postcard is not self-describing, so a
//! record of another version could decode as nonsense rather than fail.
//! Files of an older version are named as such at start-up and not read.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"NARABUJ5";
pub(crate) const SNAPSHOT_MAGIC: &[u8; 8] = b"NARABUS5";
/// The version the magics above carry.
pub(crate) const VERSION: u8 = 5;

/// The version of a journal file of an older format than this one reads
/// (its magic with an older digit), if it is one.
pub(crate) fn older_version(bytes: &[u8]) -> Option<u8> {
    let magic = bytes.get(..8)?;
    let (kind, digit) = (&magic[..7], magic[7]);
    let known = kind == &SEGMENT_MAGIC[..7] || kind == &SNAPSHOT_MAGIC[..7];
    let version = digit.checked_sub(b'0')?;
    (known && (1..VERSION).contains(&version)).then_some(version)
}
pub(crate) const FILE_HEADER: usize = 16;
pub(crate) const FRAME_HEADER: usize = 12;
/// Larger frames are damage, not data (a snapshot of a full room is far
/// below this).
const MAX_FRAME: usize = 1 << 31;

/// Append one frame holding `value` to `out`.
pub(crate) fn encode_frame<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    // Serializing plain data into a Vec cannot fail.
    let out_vec = std::mem::take(out);
    let mut out_vec = postcard::to_extend(value, out_vec).expect("records always serialize");
    let len = (out_vec.len() - start - FRAME_HEADER) as u32;
    let payload_crc = crc32c::crc32c(&out_vec[start + FRAME_HEADER..]);
    out_vec[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out_vec[start + 4..start + 8].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&out_vec[start..start + 8]);
    out_vec[start + 8..start + 12].copy_from_slice(&header_crc.to_le_bytes());
    *out = out_vec;
}

pub(crate) fn file_header(magic: &[u8; 8], seq: u64) -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[..8].copy_from_slice(magic);
    h[8..].copy_from_slice(&seq.to_le_bytes());
    h
}

/// What stopped a read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Damage {
    /// An incomplete write at the end: everything from `offset` on is a
    /// cut-short frame (or zeros).
    TornTail { offset: u64 },
    /// Bytes that were written whole and changed since.
    Corrupt { offset: u64, what: String },
}

/// The frames of a file after its header, decoded, and how the file ends.
pub(crate) struct Frames<T> {
    pub(crate) items: Vec<T>,
    /// `None` when the file ends exactly after its last frame.
    pub(crate) damage: Option<Damage>,
}

/// Check a file header; returns the sequence number in it.
pub(crate) fn read_header(bytes: &[u8], magic: &[u8; 8]) -> Result<u64, Damage> {
    if bytes.len() < FILE_HEADER {
        if magic.starts_with(&bytes[..bytes.len().min(8)]) || bytes.iter().all(|&b| b == 0) {
            return Err(Damage::TornTail { offset: 0 });
        }
        return Err(Damage::Corrupt {
            offset: 0,
            what: "not a Narabu file (bad magic)".into(),
        });
    }
    if &bytes[..8] != magic {
        return Err(Damage::Corrupt {
            offset: 0,
            what: "not a Narabu file of this kind (bad magic)".into(),
        });
    }
    Ok(u64::from_le_bytes(
        bytes[8..16].try_into().expect("8 bytes"),
    ))
}

/// Decode frames from `bytes[FILE_HEADER..]`.
pub(crate) fn read_frames<T: DeserializeOwned>(bytes: &[u8]) -> Frames<T> {
    let mut items = Vec::new();
    let mut at = FILE_HEADER;
    let end = bytes.len();
    let damage = loop {
        if at == end {
            break None;
        }
        let rest = &bytes[at..];
        if rest.len() < FRAME_HEADER || rest.iter().all(|&b| b == 0) {
            break Some(Damage::TornTail { offset: at as u64 });
        }
        let header_crc = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
        if crc32c::crc32c(&rest[..8]) != header_crc {
            break Some(Damage::Corrupt {
                offset: at as u64,
                what: "record header checksum mismatch".into(),
            });
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let payload_crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > MAX_FRAME {
            break Some(Damage::Corrupt {
                offset: at as u64,
                what: format!("record length {len} is impossible"),
            });
        }
        if rest.len() < FRAME_HEADER + len {
            break Some(Damage::TornTail { offset: at as u64 });
        }
        let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
        let last = at + FRAME_HEADER + len == end;
        if crc32c::crc32c(payload) != payload_crc {
            break Some(if last {
                Damage::TornTail { offset: at as u64 }
            } else {
                Damage::Corrupt {
                    offset: at as u64,
                    what: "record checksum mismatch".into(),
                }
            });
        }
        match postcard::from_bytes::<T>(payload) {
            Ok(item) => items.push(item),
            Err(e) => {
                break Some(Damage::Corrupt {
                    offset: at as u64,
                    what: format!("record does not decode ({e})"),
                });
            }
        }
        at += FRAME_HEADER + len;
    };
    Frames { items, damage }
}

/// Write `bytes` to `path` atomically: a temporary file, fsync, rename,
/// fsync of the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    {
        let mut f = crate::private_files::open(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true),
            &tmp,
        )?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Make a directory's entries (new, renamed, removed files) durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(records: &[&str]) -> Vec<u8> {
        let mut bytes = file_header(SEGMENT_MAGIC, 1).to_vec();
        for r in records {
            encode_frame(&r.to_string(), &mut bytes);
        }
        bytes
    }

    #[test]
    fn frames_round_trip() {
        let bytes = file(&["a", "bb", "ccc"]);
        assert_eq!(read_header(&bytes, SEGMENT_MAGIC), Ok(1));
        let f = read_frames::<String>(&bytes);
        assert_eq!(f.items, ["a", "bb", "ccc"]);
        assert_eq!(f.damage, None);
    }

    #[test]
    fn every_truncation_is_a_torn_tail_that_keeps_whole_frames() {
        let bytes = file(&["first", "second", "third"]);
        let whole = read_frames::<String>(&bytes).items;
        for cut in FILE_HEADER..bytes.len() {
            let f = read_frames::<String>(&bytes[..cut]);
            assert!(
                matches!(f.damage, None | Some(Damage::TornTail { .. })),
                "cut at {cut}: {:?}",
                f.damage
            );
            assert_eq!(f.items[..], whole[..f.items.len()]);
        }
    }

    #[test]
    fn a_flipped_byte_before_the_last_frame_is_damage() {
        let bytes = file(&["first", "second", "third"]);
        let last_start = {
            let mut b = file(&["first", "second"]);
            b.truncate(b.len());
            b.len()
        };
        for at in FILE_HEADER..last_start {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            let f = read_frames::<String>(&damaged);
            assert!(
                matches!(f.damage, Some(Damage::Corrupt { .. })),
                "flip at {at}: {:?}",
                f.damage
            );
        }
    }

    #[test]
    fn a_zero_filled_tail_is_torn() {
        let mut bytes = file(&["a"]);
        let end = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 100]);
        let f = read_frames::<String>(&bytes);
        assert_eq!(f.items, ["a"]);
        assert_eq!(f.damage, Some(Damage::TornTail { offset: end }));
    }
}
