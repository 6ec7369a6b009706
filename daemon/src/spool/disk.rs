//! The spool's file I/O, behind [`Disk`] so that tests can inject faults: every file the spool
//! writes (segments, quarantine, the sequence floor `SEQ`, the `epochs/` lists, the `RIG`
//! identity) is created, written, synced, renamed and removed through it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// The spool's file I/O, behind a trait so that tests can fail any call (EIO, ENOSPC, EMFILE),
/// make writes short or torn, or watch the order of the syncs. The index is sled's own business
/// and not behind it; nor is `LOCK`, which holds no data (only its flock matters).
pub(crate) trait Disk: Send + Sync {
    /// fdatasync of a file.
    fn sync_data(&self, file: &File) -> std::io::Result<()>;
    /// fsync of a directory, after an entry in it was created or removed.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    /// Creates a new segment file for reading and writing (fails if it exists).
    fn create(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(path)
    }
    /// Opens a segment for reading.
    fn open(&self, path: &Path) -> std::io::Result<File> {
        File::open(path)
    }
    /// Opens an existing file for writes in place (`SEQ`).
    fn open_rw(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new().read(true).write(true).open(path)
    }
    /// Creates a file, or empties the one there (the temporary file of an atomic replace).
    fn create_truncate(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    /// A directory and its parents.
    fn create_dir(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    /// Cuts a file to `len` bytes.
    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        file.set_len(len)
    }
    /// A whole segment.
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    /// One positioned write; may write less than `buf`.
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<usize> {
        file.write_at(buf, offset)
    }
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        file.read_exact_at(buf, offset)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }
    /// A new quarantine file (`AlreadyExists` when it is there already).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(path)?
            .write_all(bytes)
    }
}

/// The real disk.
pub(super) struct Os;

impl Disk for Os {
    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// An I/O error that says nothing about the data: out of file descriptors or memory, interrupted.
pub(super) fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc_errno::EMFILE
                | libc_errno::ENFILE
                | libc_errno::ENOMEM
                | libc_errno::EINTR
                | libc_errno::EAGAIN
        )
    )
}

/// The filesystem or the process is out of room (space, quota, descriptors, memory).
pub(super) fn no_room(e: &std::io::Error) -> bool {
    transient(e)
        || matches!(
            e.raw_os_error(),
            Some(libc_errno::ENOSPC | libc_errno::EDQUOT)
        )
}

pub(super) mod libc_errno {
    pub const EDQUOT: i32 = 122;
    pub const EINTR: i32 = 4;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const ENOSPC: i32 = 28;
}

/// All of `buf` at `offset`, through `disk`'s (possibly short) writes.
pub(super) fn write_all_at(
    disk: &dyn Disk,
    file: &File,
    mut buf: &[u8],
    mut offset: u64,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match disk.write_at(file, buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An atomic replace that failed, and whether before or after its rename: before it, the old
/// file stands; after it (the directory sync), the new file is in place but its name may not
/// yet be durable.
#[derive(Debug)]
pub(super) struct ReplaceFailed {
    pub renamed: bool,
    pub op: &'static str,
    pub source: std::io::Error,
}

/// Replaces `dir/name` with `bytes` through `disk`, so that a power cut leaves the old file or the
/// new one: to `name.tmp`, fsynced, renamed over `name`, the directory fsynced.
pub(super) fn replace_file_on(
    disk: &dyn Disk,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), ReplaceFailed> {
    let failed = |renamed, op| {
        move |source| ReplaceFailed {
            renamed,
            op,
            source,
        }
    };
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let f = disk
            .create_truncate(&tmp)
            .map_err(failed(false, "create"))?;
        write_all_at(disk, &f, bytes, 0).map_err(failed(false, "write"))?;
        disk.sync_data(&f).map_err(failed(false, "sync"))?;
    }
    disk.rename(&tmp, &dir.join(name))
        .map_err(failed(false, "rename"))?;
    disk.sync_dir(dir).map_err(failed(true, "sync directory"))
}
/// Bytes the filesystem allocated to a file (a sparse file takes less than its length).
pub(super) fn allocated(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.blocks().saturating_mul(512)
}
