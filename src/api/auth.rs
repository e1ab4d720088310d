//! Authentication: `AUTH` and `HELLO ... AUTH` against `api.password_file`, as Redis's
//! `requirepass` (the `default` user) works.
//!
//! With a password configured, a connection may send only `AUTH`, `HELLO`, `PING` and
//! `QUIT` (the commands flagged `no-auth`) until it gives it; anything else gets
//! `-NOAUTH Authentication required.`. `AUTH password`, `AUTH default password`, `HELLO 3
//! AUTH default password` and `HELLO 2 AUTH default password` log in; any other user name,
//! or a wrong password, gets `-WRONGPASS invalid username-password pair or user is
//! disabled.` and changes nothing (a connection already logged in stays so). The password
//! is compared in constant time ([`Secret::matches`]).
//!
//! Without a password, the `default` user takes any password (Redis's `nopass`), other
//! users are refused, and `AUTH password` is the error Redis gives for it.
//!
//! The password is the live runtime's, so a reload changes it for the commands that follow:
//! a connection logged in before stays logged in (as with Redis's `CONFIG SET
//! requirepass`), and one that never logged in is asked to once a password is set.

use super::command::{Ctx, Outcome, Spec};
use super::resp::Args;
use super::service::Throttled;
use crate::config::Secret;

/// Redis's reply to a command sent before logging in.
pub const NOAUTH: &str = "NOAUTH Authentication required.";

/// Redis's reply to a `HELLO` without `AUTH` before logging in.
pub const NOAUTH_HELLO: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time";

/// Redis's reply to wrong credentials.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// The only user: Redis's `default`.
const USER: &[u8] = b"default";

/// The password connections must give, if any.
fn password<'a>(cx: &Ctx<'a>) -> Option<&'a Secret> {
    cx.service.password(cx.runtime)
}

/// Whether `spec` may run on this connection as it is: always without a password, else
/// once logged in, or if it is flagged `no-auth`.
pub fn allowed(cx: &Ctx<'_>, spec: Option<&Spec>) -> bool {
    cx.session.authenticated
        || password(cx).is_none()
        || spec.is_some_and(|s| s.flags.contains(&"no-auth"))
}

/// Whether the connection is logged in (or needs not be).
pub fn logged_in(cx: &Ctx<'_>) -> bool {
    cx.session.authenticated || password(cx).is_none()
}

/// Checks `user` (`None`: `default`) and `pass`; on success the connection is logged in.
/// On failure the error is replied (and counted by the caller as an error).
pub fn login(cx: &mut Ctx<'_>, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Outcome> {
    let user_ok = user.is_none_or(|u| u == USER);
    let ok = match password(cx) {
        // Both compared, whatever the first says.
        Some(secret) => secret.matches(pass) & user_ok,
        None => user_ok,
    };
    if ok {
        cx.session.authenticated = true;
        return Ok(());
    }
    cx.service
        .log_throttled(Throttled::WrongPass, cx.session.peer);
    Err(cx.error(format_args!("{WRONGPASS}")))
}

/// `AUTH [username] password`.
pub fn auth(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let (user, pass) = match args.len() {
        2 => (None, args.at(1)),
        3 => (Some(args.at(1)), args.at(2)),
        _ => return cx.error(format_args!("ERR syntax error")),
    };
    if user.is_none() && password(cx).is_none() {
        return cx.error(format_args!(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
        ));
    }
    match login(cx, user, pass) {
        Ok(()) => {
            cx.out.ok();
            Outcome::Ok
        }
        Err(outcome) => outcome,
    }
}
