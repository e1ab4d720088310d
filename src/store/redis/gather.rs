//! Store calls a request phase makes together, sent together: one write, one round trip.
//!
//! A phase's shared limits are decided concurrently (`crate::runtime::decide::run`, see
//! `docs/architecture.md`, "Store budget"), so their script calls are all waiting at once.
//! Awaited one by one on the multiplexed connection they would still race its driver
//! task, on the store's own thread: the first call can be written, and answered, before
//! the next is queued, which costs a round trip each. Under [`together`] a call to a
//! standalone store is not sent on its own: it is queued here, and once every concurrent
//! decision of the phase has gone as far as it can without the store (one poll), the
//! queued calls are sent as one pipeline per connection (one write), which Redis runs back
//! to back and answers in one reply. Each call keeps its own budget timer, breaker
//! accounting and `NOSCRIPT` retry (`RedisStore::eval`): gathering only changes how the
//! bytes travel, and a call's reply or error (a pipeline's replies are one per call) is
//! its own. A Cluster connection routes each call to its key's node and sends it alone.
//!
//! Outside [`together`] (a phase with one shared limit, background calls) a call is sent
//! at once, as it always was.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

use redis::{Cmd, RedisError, Value};
use tokio::sync::oneshot;

use super::conn::Conn;

type Reply = Result<Value, RedisError>;
type Sending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One call waiting for the phase's pipeline.
struct Waiting {
    conn: Arc<Conn>,
    cmd: Cmd,
    reply: oneshot::Sender<Reply>,
}

tokio::task_local! {
    /// The calls queued since the last poll of [`together`]'s work.
    static QUEUE: RefCell<Vec<Waiting>>;
}

/// Runs `work` (the concurrent decisions of one phase) with its standalone-store calls
/// gathered into one pipeline per connection after each poll (module doc).
pub async fn together<F: Future>(work: F) -> F::Output {
    let mut work = std::pin::pin!(work);
    let mut sending: Vec<Sending> = Vec::new();
    let gathered = std::future::poll_fn(move |cx: &mut Context<'_>| {
        let out = work.as_mut().poll(cx);
        if out.is_pending() {
            flush(&mut sending);
            // Polled here, in the phase's task: a reply wakes it, and the waiting call
            // reads it on the next poll.
            sending.retain_mut(|s| s.as_mut().poll(cx).is_pending());
        }
        out
    });
    QUEUE.scope(RefCell::new(Vec::new()), gathered).await
}

/// Sends `cmd` on `conn`: queued for the phase's pipeline under [`together`] (a standalone
/// store), else at once.
pub(super) async fn req(conn: &Arc<Conn>, cmd: Cmd) -> Reply {
    if !matches!(**conn, Conn::Single(_)) {
        return conn.req(&cmd).await;
    }
    let (tx, rx) = oneshot::channel();
    let mut pending = Some(Waiting {
        conn: Arc::clone(conn),
        cmd,
        reply: tx,
    });
    let queued = QUEUE.try_with(|q| {
        if let Some(w) = pending.take() {
            q.borrow_mut().push(w);
        }
    });
    match (queued, pending) {
        // Outside a phase's `together`: at once.
        (Err(_), Some(w)) => conn.req(&w.cmd).await,
        _ => match rx.await {
            Ok(reply) => reply,
            // The pipeline was dropped unsent: only when the task itself is torn down.
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "gathered call dropped unsent",
            ))),
        },
    }
}

/// Moves the queued calls into one sending future per connection.
fn flush(sending: &mut Vec<Sending>) {
    let mut queued = QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()));
    while let Some(first) = queued.pop() {
        let conn = Arc::clone(&first.conn);
        let mut group = vec![first];
        let mut i = 0;
        while i < queued.len() {
            if Arc::ptr_eq(&queued[i].conn, &conn) {
                group.push(queued.swap_remove(i));
            } else {
                i += 1;
            }
        }
        sending.push(Box::pin(send(conn, group)));
    }
}

/// Sends `group`'s calls on `conn`, alone or as one pipeline, and hands each its reply.
async fn send(conn: Arc<Conn>, mut group: Vec<Waiting>) {
    if group.len() == 1 {
        if let Some(w) = group.pop() {
            let reply = conn.req(&w.cmd).await;
            let _ = w.reply.send(reply);
        }
        return;
    }
    let mut pipe = redis::Pipeline::with_capacity(group.len());
    let mut replies = Vec::with_capacity(group.len());
    for w in group {
        pipe.add_command(w.cmd);
        replies.push(w.reply);
    }
    match conn.pipeline(&pipe, replies.len()).await {
        Ok(values) if values.len() == replies.len() => {
            for (value, reply) in values.into_iter().zip(replies) {
                let _ = reply.send(value.extract_error());
            }
        }
        Ok(values) => {
            let e = RedisError::from((
                redis::ErrorKind::Client,
                "pipeline reply of the wrong length",
                format!("{} replies to {} calls", values.len(), replies.len()),
            ));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
