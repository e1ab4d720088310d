//! Giving every leased slice back when the process exits (SIGTERM, or the old process of
//! an upgrade): the tables of the live config stay alive until `exit`, so their `Drop`
//! never runs; [`give_back_all`] drains them and waits, bounded, for the give-back calls.
//! A table registers here once, when its limit is built (never on the decision path).
//! See `docs/fleet.md` ("Leases").

use std::sync::mpsc;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

/// A table whose slices can be given back at exit.
pub(crate) trait Closing: Send + Sync {
    /// Stops the table, drains every slice and sends the give-backs on the store's
    /// runtime; each sends one `()` on `done` when it ends. Returns how many were sent.
    fn close(&self, done: &mpsc::Sender<()>) -> usize;
}

/// The tables built so far (dead ones are pruned at each registration).
static TABLES: Mutex<Vec<Weak<dyn Closing>>> = Mutex::new(Vec::new());

/// Registers a table for [`give_back_all`].
pub(crate) fn register(table: Weak<dyn Closing>) {
    if let Ok(mut all) = TABLES.lock() {
        all.retain(|t| t.strong_count() > 0);
        all.push(table);
    }
}

/// Gives back every slice the live tables hold and waits until the calls have ended or
/// `within` has passed (a store that does not answer must not hold the exit). Returns
/// (sent, ended).
pub fn give_back_all(within: Duration) -> (usize, usize) {
    let tables: Vec<_> = match TABLES.lock() {
        Ok(all) => all.iter().filter_map(Weak::upgrade).collect(),
        Err(_) => return (0, 0),
    };
    let (tx, rx) = mpsc::channel();
    let sent: usize = tables.iter().map(|t| t.close(&tx)).sum();
    drop(tx);
    let deadline = Instant::now() + within;
    let mut ended = 0;
    while ended < sent {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(()) => ended += 1,
            Err(_) => break,
        }
    }
    (sent, ended)
}
