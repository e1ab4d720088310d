//! A TCP relay between tollgate and a real `redis-server` that counts round trips: a
//! *turn* is client bytes arriving on a connection after the server last sent bytes on it
//! (or first ever), so calls written together are one turn, and a call sent only after an
//! answer arrived is another. The relay marks the server's turn before it forwards the
//! answer, so nothing the answer causes can be counted early: the count is an event count,
//! not a timing.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// Counts round trips between its clients and one Redis (module doc).
pub struct Relay {
    addr: SocketAddr,
    turns: Arc<AtomicU64>,
}

impl Relay {
    /// Relays to `to` on a free loopback port.
    pub fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let turns = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&turns);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(to) else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                // Whether the client spoke last on this connection.
                let client_last = Arc::new(Mutex::new(AtomicBool::new(false)));
                let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (turns, last) = (Arc::clone(&counted), Arc::clone(&client_last));
                thread::spawn(move || {
                    pump(up.0, up.1, |_| {
                        let last = last.lock().unwrap();
                        if !last.swap(true, Ordering::SeqCst) {
                            turns.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                });
                thread::spawn(move || {
                    pump(server, client, |_| {
                        client_last.lock().unwrap().store(false, Ordering::SeqCst);
                    })
                });
            }
        });
        Relay { addr, turns }
    }

    /// The relay's Redis URL.
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    /// Round trips so far, over every connection.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to`, calling `seen` with each chunk before forwarding it.
fn pump(mut from: TcpStream, mut to: TcpStream, mut seen: impl FnMut(usize)) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                seen(n);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
