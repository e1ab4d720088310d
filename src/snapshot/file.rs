//! The snapshot on disk: written atomically, read only once it checks out.
//!
//! **Write.** A temporary file in the same directory (so the rename cannot cross file
//! systems), buffered writes, `fsync` of the file, `rename` over the path, `fsync` of the
//! directory (so the rename itself survives a power cut). A reader sees the previous
//! snapshot or the new one, never a mixture; a crash leaves at most a stray temporary file
//! (named `.NAME.*.tmp`, removed when the write fails in-process).
//!
//! **Read.** Two passes over one open file (a rename that replaces the path meanwhile does
//! not change what is read): the first checks magic, version, end marker and checksum in
//! 64 KiB reads; only then is the content parsed, a record at a time. Memory stays bounded
//! whatever the file's size, and the size itself is capped by what the config's tables can
//! hold ([`super::state::max_bytes`]).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::snapshot::format::{
    check_start, checksum, FormatError, Header, Sink, Source, END, MAGIC, TRAILER,
};

/// Bytes before the header: magic and version.
const START: u64 = 12;

/// An opened, verified snapshot: its header, and its sections to read as often as needed.
pub struct Opened {
    /// Who wrote it, when and why.
    pub header: Header,
    /// The file's size.
    pub size: u64,
    file: File,
    /// Where the sections start, after the header.
    sections_at: u64,
}

impl Opened {
    /// A reader of the sections, from the first: it ends where the trailer starts.
    pub fn sections(&mut self) -> io::Result<Source<io::Take<BufReader<&File>>>> {
        self.file.seek(SeekFrom::Start(self.sections_at))?;
        let len = self.size - TRAILER - self.sections_at;
        Ok(Source::new(
            BufReader::with_capacity(1 << 16, &self.file).take(len),
        ))
    }
}

/// Writes a snapshot to `path` atomically (see the module doc): `header`, then what `body`
/// writes, then the trailer. Returns `body`'s result and the bytes written. Something at
/// `path` that is not a regular file (a FIFO, a device) is refused, never replaced.
pub fn write<T>(
    path: &Path,
    header: &Header,
    body: impl FnOnce(&mut Sink<BufWriter<&File>>) -> io::Result<T>,
) -> io::Result<(T, u64)> {
    if crate::files::exists_but_not_regular(path) {
        // A FIFO or a device is the operator's, never a snapshot to be replaced.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not a regular file, so it is not replaced",
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy());
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| context(e, &format!("cannot create a file in {}", dir.display())))?;
    let (out, bytes) = {
        let mut sink = Sink::start(BufWriter::with_capacity(1 << 16, tmp.as_file()))?;
        sink.header(header)?;
        let out = body(&mut sink)?;
        let (mut w, bytes) = sink.finish()?;
        w.flush()?;
        (out, bytes)
    };
    tmp.as_file()
        .sync_all()
        .map_err(|e| context(e, "cannot sync the new file"))?;
    tmp.persist(path)
        .map_err(|e| context(e.error, "cannot rename the new file over it"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| context(e, &format!("cannot sync the directory {}", dir.display())))?;
    Ok((out, bytes))
}

fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Opens and verifies the snapshot at `path`: `None` if there is none. Refused: a file
/// that is not a snapshot, of another format version, larger than `max` bytes, cut short,
/// whose checksum does not match, or written by a build with another key-hash
/// `fingerprint`.
pub fn open(path: &Path, max: u64, fingerprint: u64) -> Result<Option<Opened>, FormatError> {
    let mut file = match crate::files::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let size = file.metadata()?.len();
    let mut start = Vec::with_capacity(START as usize);
    (&mut file).take(START).read_to_end(&mut start)?;
    if (start.len() as u64) < START {
        // A prefix of the magic is a file cut short; anything else is not a snapshot.
        let prefix = start.len().min(MAGIC.len());
        return Err(if start[..prefix] == MAGIC[..prefix] {
            FormatError::Truncated(size)
        } else {
            FormatError::NotSnapshot
        });
    }
    check_start(&start)?;
    if size > max {
        return Err(FormatError::TooLarge { size, max });
    }
    if size < START + TRAILER {
        return Err(FormatError::Truncated(size));
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.seek(SeekFrom::Start(size - TRAILER))?;
    file.read_exact(&mut trailer)?;
    if &trailer[8..] != END {
        return Err(FormatError::Truncated(size));
    }
    let stored = u64::from_le_bytes(trailer[..8].try_into().unwrap_or_default());
    file.seek(SeekFrom::Start(0))?;
    if checksum((&mut file).take(size - TRAILER))? != stored {
        return Err(FormatError::Checksum);
    }
    file.seek(SeekFrom::Start(START))?;
    let mut counted = Counted {
        inner: BufReader::new(&file).take(size - TRAILER - START),
        read: 0,
    };
    let header = Source::new(&mut counted).header()?;
    if header.fingerprint != fingerprint {
        return Err(FormatError::Foreign {
            theirs: header.fingerprint,
            ours: fingerprint,
        });
    }
    let sections_at = START + counted.read;
    Ok(Some(Opened {
        header,
        size,
        file,
        sections_at,
    }))
}

/// A reader that counts what it yields.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The header of the snapshot at `path`, unverified (a peek, for a successor waiting at an
/// upgrade to see who wrote the file and why); `None` if there is none or it is not one.
pub fn peek(path: &Path) -> Option<Header> {
    let mut file = BufReader::new(crate::files::open_regular(path).ok()?);
    let mut start = [0u8; START as usize];
    file.read_exact(&mut start).ok()?;
    check_start(&start).ok()?;
    Source::new(file).header().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::Reason;

    fn header(fingerprint: u64) -> Header {
        Header {
            fingerprint,
            written_at: 1_700_000_000_000_000_000,
            reason: Reason::Periodic,
            pid: 42,
            started_at: 1_600_000_000_000_000_000,
            instance: "edge-1".into(),
            version: "0.1.0".into(),
        }
    }

    fn write_one(path: &Path, fingerprint: u64) -> u64 {
        let (_, bytes) = write(path, &header(fingerprint), |sink| {
            sink.u8(1)?;
            sink.u64(0xdead_beef)
        })
        .expect("write");
        bytes
    }

    #[test]
    fn a_written_file_reads_back_and_damage_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.snap");
        assert!(open(&path, 1 << 20, 7).expect("absent").is_none());
        let bytes = write_one(&path, 7);
        assert_eq!(std::fs::metadata(&path).expect("file").len(), bytes);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");

        let mut opened = open(&path, 1 << 20, 7).expect("valid").expect("present");
        assert_eq!(opened.header, header(7));
        for _ in 0..2 {
            let mut sections = opened.sections().expect("sections");
            assert_eq!(sections.u8().expect("tag"), 1);
            assert_eq!(sections.u64().expect("u64"), 0xdead_beef);
            assert_eq!(sections.u8().expect("end"), 0);
            assert!(sections.u8().is_err(), "the trailer is not content");
        }
        assert_eq!(peek(&path), Some(header(7)));

        let good = std::fs::read(&path).expect("read");
        let refused = |bytes: &[u8], max: u64| {
            std::fs::write(&path, bytes).expect("write");
            open(&path, max, 7)
                .map(|_| ())
                .expect_err("refused")
                .to_string()
        };
        let mut flipped = good.clone();
        flipped[30] ^= 1;
        assert_eq!(refused(&flipped, 1 << 20), "corrupt (checksum mismatch)");
        let cut = refused(&good[..good.len() - 3], 1 << 20);
        assert!(cut.starts_with("truncated"), "{cut}");
        assert!(refused(&good[..5], 1 << 20).starts_with("truncated"));
        assert_eq!(
            refused(b"hello world, a text file\n", 1 << 20),
            "not a tollgate snapshot (no magic)"
        );
        assert_eq!(refused(b"", 1 << 20), "truncated (0 bytes, no end marker)");
        let mut v2 = good.clone();
        v2[8] = 2;
        assert_eq!(
            refused(&v2, 1 << 20),
            "format version 2, this build reads version 1"
        );
        assert!(refused(&good, 10).contains("more than the 10 bytes"));

        write_one(&path, 8);
        let foreign = open(&path, 1 << 20, 7).map(|_| ()).expect_err("foreign");
        assert!(foreign.to_string().starts_with("foreign"), "{foreign}");
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing").join("state.snap");
        let e = write(&path, &header(1), |_| Ok(())).expect_err("no directory");
        assert!(e.to_string().contains("cannot create a file in"), "{e}");
    }
}
