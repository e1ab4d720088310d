//! Carrying limiter state out of a process and back in: the outcome of putting one saved
//! key back into a table ([`Restored`]).
//!
//! Each stateful kind that outlives a request (token bucket, rate, sliding log, tiered)
//! has an `export` that walks its live keys, one set at a time (a set's lock is held only
//! while its slots are copied, so decisions on other sets never wait and decisions on the
//! same set wait for at most eight copies), and an `import` that puts a saved key back.
//! Times are the limiter's own [`Nanos`](crate::limits::Nanos); converting them between
//! processes is the caller's business (see "Snapshots" in `docs/architecture.md`).
//!
//! An import never evicts: the table it fills is the authority on what it holds, and a
//! restored key takes only an empty slot, or one whose state equals absent by now. Restored
//! into a table of the same shape (the only case the snapshot loader allows), a key always
//! finds its slot, because it had one in the table it came from and the slot a key may use
//! depends only on the key and the table's size.

/// What [`import`](crate::limits::TokenBucket::import) did with one saved key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The key holds its saved state again.
    Stored,
    /// By `now` the saved state equals a key never seen (a bucket refilled to full, a
    /// window or log that emptied): nothing needs storing, and nothing is lost.
    Empty,
    /// The key's set has no free slot (a table fuller than the one the key came from):
    /// the key starts as new, as after an eviction.
    NoRoom,
}

#[cfg(test)]
mod tests;
