//! Opening the files an operator names: the config, its admin token file, segment files and
//! the snapshot. Regular files only, and an open that never blocks.
//!
//! Opening a FIFO for reading blocks until some process opens it for writing, which may be
//! never: a FIFO at one of these paths would hang `tollgate check`, hold a start before it
//! listens, or wedge the reloader (later edits and SIGHUP ignored, shutdown waiting on it).
//! A device file could stream without end. So [`open_regular`] opens with `O_NONBLOCK`
//! (a FIFO's open then returns at once; on a regular file the flag changes nothing, as reads
//! of regular files never block) and checks the *descriptor* with `fstat`: anything but a
//! regular file is refused with an [`io::ErrorKind::InvalidInput`] error naming its type.
//! Checking what was opened, not the path, leaves no window for a swap in between.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// One version of a file, told without reading it: device and inode (a file replaced by a
/// rename, as `tollgate segment build --out` and `mv` do, is a new inode), size, and the
/// modification and status-change times in nanoseconds (a rewrite in place changes both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    /// The stamp of what `meta` describes (from `fstat` of an open file, or `stat`).
    pub fn of(meta: &Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The stamp of the file at `path` now (following symlinks; `stat` never blocks), or
    /// `None` if it cannot be read.
    pub fn read(path: &Path) -> Option<Stamp> {
        std::fs::metadata(path).ok().map(|m| Stamp::of(&m))
    }
}

/// Opens `path` (following symlinks) for reading if it is a regular file, without ever
/// blocking on a FIFO; anything else is an `InvalidInput` error saying what it is.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file"),
    ))
}

/// Whether `path` names something other than a regular file (following symlinks), by
/// `stat` alone, which never blocks; a missing or unreadable path is not, so the caller's
/// own open reports it.
pub fn exists_but_not_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open_and_a_fifo_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(open_regular(&file).is_ok());
        assert!(!exists_but_not_regular(&file));
        let fifo = dir.path().join("p");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // No writer: a plain open would block here for ever.
        let e = open_regular(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "a FIFO (named pipe), not a regular file");
        assert!(exists_but_not_regular(&fifo));
        let e = open_regular(dir.path()).unwrap_err();
        assert_eq!(e.to_string(), "a directory, not a regular file");
        assert_eq!(
            open_regular(&dir.path().join("none")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(!exists_but_not_regular(&dir.path().join("none")));
    }
}
