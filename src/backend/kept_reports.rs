//! The reports of lines an operator replaced, kept for a while after the
//! line is gone: a sale's report is wanted most once the sale is over,
//! and a room's next sale starts a new line (and a new admission record,
//! which the live report is computed from).
//!
//! The embedded deployment keeps each as a file in the data directory
//! (`reports/{room}.{epoch}.json`, written whole and renamed into place, so
//! a crash leaves the old file or the new one); one without a data
//! directory keeps them in memory. An expired report is removed when the
//! room's reports are next read or one is kept. On Redis they are keys
//! that expire by themselves (the store's `put_report`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::KeptReport;
use crate::engine::RoomId;

/// Where the embedded deployment keeps reports.
#[derive(Debug)]
pub(crate) struct Shelf {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<(RoomId, u64), KeptReport>>,
}

impl Shelf {
    /// Reports in `data_dir/reports`, or in memory without a data directory.
    pub(crate) fn new(data_dir: Option<&Path>) -> Self {
        Self {
            dir: data_dir.map(|d| d.join("reports")),
            memory: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn keep(&self, room: &RoomId, kept: &KeptReport, now: u64) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            let mut memory = crate::locks::lock(&self.memory);
            memory.retain(|_, k| k.expires_at > now);
            memory.insert((room.clone(), kept.epoch), kept.clone());
            return Ok(());
        };
        crate::private_files::create_dir_all(dir)?;
        let path = dir.join(format!("{room}.{}.json", kept.epoch));
        let part = path.with_extension("json.part");
        let bytes = serde_json::to_vec(kept).map_err(std::io::Error::other)?;
        {
            use std::io::Write;
            let mut file = crate::private_files::open(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true),
                &part,
            )?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&part, &path)?;
        self.list(room, now).map(|_| ())
    }

    /// The room's unexpired reports, newest line first.
    pub(crate) fn list(&self, room: &RoomId, now: u64) -> std::io::Result<Vec<KeptReport>> {
        let mut kept: Vec<KeptReport> = match &self.dir {
            None => crate::locks::lock(&self.memory)
                .iter()
                .filter(|((r, _), k)| r == room && k.expires_at > now)
                .map(|(_, k)| k.clone())
                .collect(),
            Some(dir) => {
                let prefix = format!("{room}.");
                let entries = match std::fs::read_dir(dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(e),
                };
                let mut kept = Vec::new();
                for entry in entries {
                    let path = entry?.path();
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    // `room.7.json`, and not `room-b.7.json` for `room`.
                    let ours = name
                        .strip_prefix(&prefix)
                        .and_then(|rest| rest.strip_suffix(".json"))
                        .is_some_and(|epoch| epoch.parse::<u64>().is_ok());
                    if !ours {
                        continue;
                    }
                    let report = std::fs::read(&path)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<KeptReport>(&b).ok());
                    match report {
                        Some(k) if k.expires_at > now => kept.push(k),
                        // Expired, or not a report this version reads.
                        _ => std::fs::remove_file(&path)?,
                    }
                }
                kept
            }
        };
        kept.sort_by_key(|k| std::cmp::Reverse(k.epoch));
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{AdmissionRecord, RoomSettings};

    fn kept(room: &RoomId, epoch: u64, expires_at: u64) -> KeptReport {
        let record = AdmissionRecord::new(room.as_str(), epoch);
        KeptReport {
            epoch,
            ended_at: 1,
            expires_at,
            report: crate::report::report(&record, &RoomSettings::new(room.clone()), Vec::new()),
        }
    }

    #[test]
    fn reports_outlive_a_restart_until_they_expire_and_rooms_keep_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (sale, sale_b) = (RoomId::new("sale").unwrap(), RoomId::new("sale-b").unwrap());
        let shelf = Shelf::new(Some(dir.path()));
        shelf.keep(&sale, &kept(&sale, 7, 100), 10).unwrap();
        shelf.keep(&sale, &kept(&sale, 9, 200), 10).unwrap();
        shelf.keep(&sale_b, &kept(&sale_b, 8, 100), 10).unwrap();

        // A new shelf on the same directory: as after a restart.
        let shelf = Shelf::new(Some(dir.path()));
        let epochs = |room: &RoomId, now: u64, shelf: &Shelf| -> Vec<u64> {
            shelf
                .list(room, now)
                .unwrap()
                .iter()
                .map(|k| k.epoch)
                .collect()
        };
        assert_eq!(epochs(&sale, 50, &shelf), vec![9, 7], "newest first");
        assert_eq!(shelf.list(&sale, 50).unwrap()[1], kept(&sale, 7, 100));
        assert_eq!(epochs(&sale_b, 50, &shelf), vec![8]);
        assert_eq!(epochs(&sale, 100, &shelf), vec![9], "expired at its time");
        let files = std::fs::read_dir(dir.path().join("reports"))
            .unwrap()
            .count();
        assert_eq!(files, 2, "an expired report's file is removed");
        // Something else in the directory is left alone.
        std::fs::write(dir.path().join("reports/notes.txt"), "mine").unwrap();
        assert_eq!(epochs(&sale, 150, &shelf), vec![9]);
        assert!(dir.path().join("reports/notes.txt").exists());

        let memory = Shelf::new(None);
        memory.keep(&sale, &kept(&sale, 3, 100), 10).unwrap();
        assert_eq!(epochs(&sale, 99, &memory), vec![3]);
        assert_eq!(epochs(&sale, 100, &memory), Vec::<u64>::new());
    }
}
