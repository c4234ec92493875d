//! The snapshot on disk: two slot files in `state_dir`, written alternately, each
//! replaced atomically (temp file → fsync → rename → fsync of the directory), read back
//! through a read-only memory map and [`file::decode`]. The newest valid slot wins; a slot
//! that fails any check is moved aside (renamed `<slot>.rejected-<wall ms>`), logged once,
//! and never read again — never trusted, never fatal.
//!
//! One writer per directory: the store writes only while it holds an exclusive advisory
//! lock on [`LOCK_FILE`] (`flock`, released by the kernel when the process exits, however
//! it exits). During a zero-downtime handover (`server.allow_shared_listen`) the new
//! instance starts while the old one still drains and writes; the new one reads the slots
//! but writes nothing until the old one has written its last snapshot and exited, then
//! takes the lock, reads the slots' generations again and continues above them
//! ([`Store::take_over`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::file::{self, HEADER_BYTES, Header, MAX_PAYLOAD_BYTES, Problem};
use super::schema::Contents;

/// The two slot files, in `state_dir`.
pub const SLOT_FILES: [&str; 2] = ["snapshot-a.tgsnap", "snapshot-b.tgsnap"];
/// Suffix of a slot's temporary file while it is being written.
pub const TEMP_SUFFIX: &str = ".tmp";
/// The file whose advisory lock makes one process the directory's writer.
pub const LOCK_FILE: &str = "writer.lock";

/// A slot that decoded.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub slot: usize,
    pub path: PathBuf,
    pub header: Header,
    pub contents: Contents,
}

/// What one slot held.
#[derive(Debug)]
pub enum SlotRead {
    Missing,
    Valid(Box<Loaded>),
    Invalid(String),
}

/// A file that failed its checks at start-up.
#[derive(Clone, Debug)]
pub struct Rejected {
    pub path: PathBuf,
    pub problem: String,
    /// Where it was moved (None: the rename failed; the file is still ignored).
    pub moved_to: Option<PathBuf>,
}

/// Reads one slot file. Never panics, never trusts.
pub fn read_slot(dir: &Path, slot: usize) -> SlotRead {
    let Some(name) = SLOT_FILES.get(slot) else {
        return SlotRead::Missing;
    };
    let path = dir.join(name);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return SlotRead::Missing,
        Err(e) => return SlotRead::Invalid(format!("cannot open: {e}")),
    };
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return SlotRead::Invalid(format!("cannot stat: {e}")),
    };
    if len == 0 {
        return SlotRead::Invalid(Problem::Empty.to_string());
    }
    if len > HEADER_BYTES as u64 + MAX_PAYLOAD_BYTES {
        return SlotRead::Invalid(Problem::PayloadTooLarge(len).to_string());
    }
    let map = match map_read_only(&f) {
        Ok(m) => m,
        Err(e) => return SlotRead::Invalid(format!("cannot map: {e}")),
    };
    match file::decode(&map) {
        Ok((header, contents)) => SlotRead::Valid(Box::new(Loaded {
            slot,
            path,
            header,
            contents,
        })),
        Err(p) => SlotRead::Invalid(p.to_string()),
    }
}

/// Maps `f` read-only.
#[allow(unsafe_code)]
fn map_read_only(f: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: `Mmap::map` is unsafe because the mapped file could change while the map is
    // alive, and the bytes we hold would change under us. The map lives only inside
    // `read_slot`, which decodes (copying everything it keeps) and drops it. The slot
    // files are never written in place: a write goes to a temporary file that is then
    // renamed over the slot, which swaps the directory entry and leaves the inode mapped
    // here untouched. Only another process truncating the file inside this window could
    // still hurt us (SIGBUS); the state directory belongs to this gateway alone.
    unsafe { memmap2::Mmap::map(f) }
}

/// The slots at start-up: the newest valid one, and the files that failed (already
/// moved aside and logged).
#[derive(Debug)]
pub struct Opened {
    pub store: Store,
    pub loaded: Option<Loaded>,
    pub rejected: Vec<Rejected>,
}

/// Writes the slots alternately, while it holds the directory's lock.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    next_generation: u64,
    next_slot: usize,
    /// The lock file, once this process holds its lock (`None`: another process does).
    lock: Option<File>,
}

/// Why `serve`, run as this user, could not use `dir` as its state directory, found without
/// creating or writing anything (for `tidegate check`): `Err(Fatal)` when no user could (a
/// path component that is a file), `Err(NotWritable)` when this user cannot create or write
/// it (`serve` may run as another user).
pub fn probe(dir: &Path) -> Result<(), Unusable> {
    let mut at = Some(dir);
    while let Some(p) = at {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                return if writable(p) {
                    Ok(())
                } else if p == dir {
                    Err(Unusable::NotWritable(format!(
                        "{} is not writable",
                        p.display()
                    )))
                } else {
                    Err(Unusable::NotWritable(format!(
                        "{} does not exist and {} is not writable",
                        dir.display(),
                        p.display()
                    )))
                };
            }
            Ok(_) => {
                return Err(Unusable::Fatal(format!(
                    "{} is not a directory",
                    p.display()
                )));
            }
            // A missing entry, or one below a file (the file is reported when reached).
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                at = p.parent();
            }
            Err(e) => return Err(Unusable::Fatal(format!("{}: {e}", p.display()))),
        }
        if at == Some(Path::new("")) {
            // A relative path's first component: its parent is the working directory.
            at = (p != Path::new(".")).then_some(Path::new("."));
        }
    }
    Ok(())
}

/// What [`probe`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Unusable {
    Fatal(String),
    NotWritable(String),
}

/// The calling user may create entries in the directory `p` (`access(2)`, W_OK | X_OK).
#[allow(unsafe_code)]
fn writable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call; access(2) only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Takes the directory's writer lock if no other process holds it: `Some(file)` holds it
/// until dropped (or the process exits). A file system without advisory locks counts as
/// held: there is nothing to wait for.
fn try_lock(dir: &Path) -> io::Result<Option<File>> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => Ok(Some(f)),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Removes the temporary files an interrupted write left (only the lock's holder may:
/// another writer's file could be in flight).
fn remove_temp_files(dir: &Path) {
    for name in SLOT_FILES {
        let tmp = dir.join(format!("{name}{TEMP_SUFFIX}"));
        if tmp.exists() {
            // A write interrupted before its rename: never a slot, never read.
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// Where the next write goes: above the newest generation on disk, into the other slot.
fn next_after(newest: Option<(u64, usize)>) -> (u64, usize) {
    match newest {
        Some((generation, slot)) => (generation.saturating_add(1), 1 - slot),
        None => (1, 0),
    }
}

/// One completed write.
#[derive(Clone, Debug)]
pub struct Written {
    pub generation: u64,
    pub bytes: usize,
    pub path: PathBuf,
}

/// Opens `dir` (created if missing): reads both slots, moves invalid files aside (the
/// caller logs each), removes temporary files a crash left, and returns the newest valid
/// slot. Only a directory that cannot be created is an error.
pub fn open(dir: &Path, now_wall_ms: u64) -> io::Result<Opened> {
    fs::create_dir_all(dir)?;
    let lock = try_lock(dir)?;
    if lock.is_some() {
        remove_temp_files(dir);
    }
    let mut valid: Vec<Loaded> = Vec::new();
    let mut rejected = Vec::new();
    for (slot, name) in SLOT_FILES.iter().enumerate() {
        match read_slot(dir, slot) {
            SlotRead::Missing => {}
            SlotRead::Valid(l) => valid.push(*l),
            SlotRead::Invalid(problem) => {
                let path = dir.join(name);
                // Moved aside by the directory's writer only; otherwise just not read.
                let moved_to = lock.as_ref().and_then(|_| {
                    let aside = dir.join(format!("{name}.rejected-{now_wall_ms}"));
                    fs::rename(&path, &aside).ok().map(|()| aside)
                });
                rejected.push(Rejected {
                    path,
                    problem,
                    moved_to,
                });
            }
        }
    }
    valid.sort_by_key(|l| l.header.generation);
    let loaded = valid.pop();
    let (next_generation, next_slot) =
        next_after(loaded.as_ref().map(|l| (l.header.generation, l.slot)));
    if rejected.is_empty() && lock.is_some() {
        fsync_dir(dir)?;
    }
    Ok(Opened {
        store: Store {
            dir: dir.to_path_buf(),
            next_generation,
            next_slot,
            lock,
        },
        loaded,
        rejected,
    })
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Store {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes this process the directory's writer if it is not yet: takes the lock when the
    /// process holding it has exited, then places the next write above the newest
    /// generation on disk (the previous holder's last write). `Ok(false)`: another process
    /// still holds it.
    pub fn take_over(&mut self) -> io::Result<bool> {
        if self.lock.is_some() {
            return Ok(true);
        }
        let Some(lock) = try_lock(&self.dir)? else {
            return Ok(false);
        };
        remove_temp_files(&self.dir);
        let newest = (0..SLOT_FILES.len())
            .filter_map(|slot| match read_slot(&self.dir, slot) {
                SlotRead::Valid(l) => Some((l.header.generation, slot)),
                _ => None,
            })
            .max();
        let (generation, slot) = next_after(newest);
        self.next_generation = generation.max(self.next_generation);
        self.next_slot = slot;
        self.lock = Some(lock);
        Ok(true)
    }

    /// Writes `contents` into the older slot: temp file, fsync, rename, fsync of the
    /// directory. A crash at any point leaves the previous slot intact, and the slot being
    /// written either intact (old) or complete (new).
    /// Refused while another process holds the directory (see [`Self::take_over`]).
    pub fn write(&mut self, contents: Contents, now_wall_ms: u64) -> io::Result<Written> {
        if self.lock.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another Tidegate instance is the state_dir's writer",
            ));
        }
        let bytes = file::encode(self.next_generation, now_wall_ms, contents)
            .map_err(|e| io::Error::other(e.0))?;
        let name = SLOT_FILES[self.next_slot % SLOT_FILES.len()];
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}{TEMP_SUFFIX}"));
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &path)?;
        fsync_dir(&self.dir)?;
        let written = Written {
            generation: self.next_generation,
            bytes: bytes.len(),
            path,
        };
        self.next_generation = self.next_generation.saturating_add(1);
        self.next_slot = 1 - (self.next_slot % SLOT_FILES.len());
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_creates_nothing_and_names_what_is_in_the_way() {
        let d = tmpdir("probe");
        fs::create_dir_all(&d).unwrap();
        // Missing below a writable directory: fine, and still missing.
        let deep = d.join("a/b/c");
        assert_eq!(probe(&deep), Ok(()));
        assert!(!d.join("a").exists());
        assert_eq!(probe(&d), Ok(()));
        // A file in the way is fatal for any user.
        fs::write(d.join("file"), b"x").unwrap();
        match probe(&d.join("file/state")) {
            Err(Unusable::Fatal(m)) => assert!(m.ends_with("file is not a directory"), "{m}"),
            other => panic!("{other:?}"),
        }
        match probe(&d.join("file")) {
            Err(Unusable::Fatal(m)) => assert!(m.contains("is not a directory"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A relative path resolves against the working directory (writable in tests).
        assert_eq!(probe(Path::new("tidegate-probe-never-created/x")), Ok(()));
        assert!(!Path::new("tidegate-probe-never-created").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tidegate-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn contents(n: u32) -> Contents {
        let mut c = Contents::default();
        c.connections
            .push(crate::snapshot::schema::ConnectionEntry {
                connection: format!("c{n}"),
                provider: "p".into(),
                test_status: "banned".into(),
                rate_limited_until_wall_ms: None,
                cooldown_reason: None,
                backoff_level: n,
                last_error: None,
                last_error_type: None,
                error_code: None,
                last_error_at_wall_ms: None,
                reject_streak: None,
                expired_strikes: None,
            });
        c
    }

    #[test]
    fn slots_alternate_and_the_newest_valid_wins() {
        let d = tmpdir("alternate");
        let mut o = open(&d, 1).unwrap();
        assert!(o.loaded.is_none());
        o.store.write(contents(1), 10).unwrap();
        o.store.write(contents(2), 20).unwrap();
        o.store.write(contents(3), 30).unwrap();
        // Each store below is dropped before the next open: one writer per directory.
        drop(o);
        let o = open(&d, 2).unwrap();
        drop(o.store);
        let l = o.loaded.unwrap();
        assert_eq!(l.header.generation, 3);
        assert_eq!(l.contents, contents(3));
        // The newer slot damaged: the older one wins, the damaged one is moved aside.
        fs::write(&l.path, b"garbage").unwrap();
        let o = open(&d, 3).unwrap();
        assert_eq!(o.loaded.unwrap().header.generation, 2);
        assert_eq!(o.rejected.len(), 1);
        assert!(!l.path.exists());
        assert!(o.rejected[0].moved_to.as_ref().unwrap().exists());
        // The next write goes to the free slot and continues the generations.
        let mut store = o.store;
        let w = store.write(contents(4), 40).unwrap();
        assert_eq!(w.generation, 3);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_second_store_on_the_directory_waits_then_continues_above_the_first() {
        let d = tmpdir("handover");
        let mut first = open(&d, 1).unwrap().store;
        first.write(contents(1), 10).unwrap();
        let second = open(&d, 2).unwrap();
        assert_eq!(second.loaded.as_ref().unwrap().header.generation, 1);
        let mut second = second.store;
        assert!(!second.take_over().unwrap());
        assert!(
            second.write(contents(9), 20).is_err(),
            "no write while the first holds it"
        );
        // The first keeps writing, then goes away (its lock with it).
        first.write(contents(2), 30).unwrap();
        first.write(contents(3), 40).unwrap();
        drop(first);
        assert!(second.take_over().unwrap());
        let w = second.write(contents(4), 50).unwrap();
        assert_eq!(w.generation, 4, "above the first's last write");
        let o = open(&d, 3).unwrap();
        assert_eq!(o.loaded.unwrap().contents, contents(4));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn both_slots_bad_is_a_clean_start() {
        let d = tmpdir("bothbad");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(SLOT_FILES[0]), b"").unwrap();
        fs::write(d.join(SLOT_FILES[1]), b"TGSNAPSH").unwrap();
        fs::write(d.join(format!("{}{TEMP_SUFFIX}", SLOT_FILES[0])), b"half").unwrap();
        let o = open(&d, 5).unwrap();
        assert!(o.loaded.is_none());
        assert_eq!(o.rejected.len(), 2);
        assert!(!d.join(format!("{}{TEMP_SUFFIX}", SLOT_FILES[0])).exists());
        let _ = fs::remove_dir_all(&d);
    }
}
