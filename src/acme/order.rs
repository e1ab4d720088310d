//! One ACME order for one host (RFC 8555, section 7.4): new order, its authorization's
//! challenge answered (TLS-ALPN-01 on the TLS listeners, HTTP-01 on the plaintext ones),
//! the CA told, the order polled until ready, finalized with a CSR for a new key, and the
//! chain downloaded. The challenges are withdrawn however the order ends.
//!
//! instant-acme speaks the protocol (JWS, nonces and `badNonce` retries, polling); this
//! file decides which challenge to answer and where the answer goes.

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Error as AcmeError, Identifier, NewOrder,
    OrderStatus, Problem, RetryPolicy,
};

use crate::acme::keys;
use crate::acme::storage::{SharedChallenge, Storage, Stored};
use crate::config::AcmeChallenge;
use crate::tls::managed::Managed;

/// How long the CA may take to validate and to issue, each.
const POLL_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the ordering instance of a fleet waits, once its challenge is published,
/// before asking the CA to validate: the others poll for it every
/// [`super::WAITING_TICK`].
const FLEET_PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// Which listeners the process has: which challenges it can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    /// A `tls: true` listener (TLS-ALPN-01).
    pub tls: bool,
    /// A plaintext listener (HTTP-01).
    pub plain: bool,
}

/// Why an order failed: its text carries the CA's problem document when there is one.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The CA refused or the protocol failed.
    #[error("{}", describe(.0))]
    Acme(#[from] AcmeError),
    /// Something else (no usable challenge, a validation that failed, a bad chain).
    #[error("{0}")]
    Other(String),
}

impl OrderError {
    /// Whether the CA no longer knows the account (it was deactivated, or a test CA
    /// restarted): the next attempt makes a new one.
    pub fn account_unknown(&self) -> bool {
        match self {
            OrderError::Acme(AcmeError::Api(p)) => p
                .r#type
                .as_deref()
                .is_some_and(|t| t.ends_with(":accountDoesNotExist")),
            _ => false,
        }
    }
}

/// A problem document as one line: `type: detail (status)`, then its subproblems.
pub fn problem_line(p: &Problem) -> String {
    let mut out = format!(
        "CA problem {}: {}",
        p.r#type.as_deref().unwrap_or("(no type)"),
        p.detail.as_deref().unwrap_or("(no detail)")
    );
    if let Some(status) = p.status {
        out.push_str(&format!(" (HTTP {status})"));
    }
    for sub in &p.subproblems {
        out.push_str(&format!(
            "; {}: {}",
            sub.r#type.as_deref().unwrap_or("(no type)"),
            sub.detail.as_deref().unwrap_or("(no detail)")
        ));
    }
    out
}

fn describe(e: &AcmeError) -> String {
    match e {
        AcmeError::Api(p) => problem_line(p),
        other => format!("ACME: {other}"),
    }
}

/// What one order needs.
pub struct Ctx<'a> {
    /// The account.
    pub account: &'a Account,
    /// The board the challenges go on.
    pub managed: &'a Arc<Managed>,
    /// The storage (a shared one publishes the challenges for the fleet).
    pub storage: &'a Storage,
    /// `tls.acme.challenge`.
    pub challenge: AcmeChallenge,
    /// The process's listeners.
    pub listeners: Listeners,
}

/// Orders a certificate for `host`: its chain and key, as PEM.
pub async fn order(ctx: &Ctx<'_>, host: &str) -> Result<Stored, OrderError> {
    let mut tokens = Vec::new();
    let result = run(ctx, host, &mut tokens).await;
    ctx.managed.clear_challenges(host, &tokens);
    if ctx.storage.shared() {
        if let Err(e) = ctx.storage.clear_challenge(host).await {
            log::debug!("tls.acme: {host}: cannot clear the published challenge: {e}");
        }
    }
    result
}

/// The challenge to answer among those the CA `offered`.
fn pick(
    offered: &[ChallengeType],
    wanted: AcmeChallenge,
    listeners: Listeners,
) -> Option<ChallengeType> {
    let alpn = offered.contains(&ChallengeType::TlsAlpn01);
    let http = offered.contains(&ChallengeType::Http01);
    match wanted {
        AcmeChallenge::TlsAlpn01 => alpn.then_some(ChallengeType::TlsAlpn01),
        AcmeChallenge::Http01 => http.then_some(ChallengeType::Http01),
        AcmeChallenge::Auto => {
            if alpn && listeners.tls {
                Some(ChallengeType::TlsAlpn01)
            } else if http && listeners.plain {
                Some(ChallengeType::Http01)
            } else {
                None
            }
        }
    }
}

async fn run(ctx: &Ctx<'_>, host: &str, tokens: &mut Vec<String>) -> Result<Stored, OrderError> {
    let ids = [Identifier::Dns(host.to_string())];
    let mut order = ctx.account.new_order(&NewOrder::new(&ids)).await?;
    let mut ready = Vec::new();
    {
        let mut authzs = order.authorizations();
        while let Some(authz) = authzs.next().await {
            let mut authz = authz?;
            match authz.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => {
                    return Err(OrderError::Other(format!(
                        "the CA's authorization for {host} is {other:?}"
                    )))
                }
            }
            let offered: Vec<ChallengeType> =
                authz.challenges.iter().map(|c| c.r#type.clone()).collect();
            let Some(kind) = pick(&offered, ctx.challenge, ctx.listeners) else {
                return Err(OrderError::Other(format!(
                    "no challenge to answer for {host}: the CA offers {offered:?}, tls.acme.challenge is {} and the listeners are {}",
                    ctx.challenge.name(),
                    match (ctx.listeners.tls, ctx.listeners.plain) {
                        (true, true) => "TLS and plaintext",
                        (true, false) => "TLS only (HTTP-01 needs a plaintext one)",
                        (false, true) => "plaintext only (TLS-ALPN-01 needs a TLS one)",
                        (false, false) => "none",
                    }
                )));
            };
            let mut challenge = authz
                .challenge(kind.clone())
                .ok_or_else(|| OrderError::Other("the challenge vanished".into()))?;
            let key_auth = challenge.key_authorization();
            let mut shared = SharedChallenge {
                alpn_digest: None,
                http: None,
            };
            if kind == ChallengeType::TlsAlpn01 {
                let digest = key_auth.digest();
                let cert = keys::challenge_cert(host, digest.as_ref()).map_err(|e| {
                    OrderError::Other(format!("cannot make the challenge certificate: {e}"))
                })?;
                ctx.managed.add_alpn(host, cert);
                shared.alpn_digest = Some(hex(digest.as_ref()));
            } else {
                ctx.managed.add_http(&challenge.token, key_auth.as_str());
                tokens.push(challenge.token.clone());
                shared.http = Some((challenge.token.clone(), key_auth.as_str().to_string()));
            }
            if ctx.storage.shared() {
                ctx.storage
                    .publish_challenge(host, &shared)
                    .await
                    .map_err(|e| OrderError::Other(e.to_string()))?;
                tokio::time::sleep(FLEET_PUBLISH_WAIT).await;
            }
            challenge.set_ready().await?;
            ready.push(kind);
        }
    }
    let retries = RetryPolicy::new().timeout(POLL_TIMEOUT);
    let status = order.poll_ready(&retries).await?;
    if status != OrderStatus::Ready {
        return Err(OrderError::Other(
            validation_errors(&mut order, host, status).await,
        ));
    }
    let key = keys::new_key().map_err(|e| OrderError::Other(format!("cannot make a key: {e}")))?;
    let csr = keys::csr(host, &key)
        .map_err(|e| OrderError::Other(format!("cannot make the CSR: {e}")))?;
    order.finalize_csr(&csr).await?;
    let chain = order.poll_certificate(&retries).await?;
    let key = key
        .private_key_to_pem_pkcs8()
        .map_err(|e| OrderError::Other(format!("cannot write the key: {e}")))?;
    Ok(Stored {
        chain,
        key: String::from_utf8_lossy(&key).into_owned(),
    })
}

/// Why the order is not ready: each challenge's error, as the CA reported it.
async fn validation_errors(
    order: &mut instant_acme::Order,
    host: &str,
    status: OrderStatus,
) -> String {
    let mut out = format!("the order for {host} is {status:?}");
    let mut authzs = order.authorizations();
    while let Some(Ok(mut authz)) = authzs.next().await {
        if let Ok(state) = authz.refresh().await {
            for c in &state.challenges {
                if let Some(p) = &c.error {
                    out.push_str(&format!("; {:?}: {}", c.r#type, problem_line(p)));
                }
            }
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex string (a published digest), `None` if it is not one.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_what_the_listeners_can_answer() {
        let both = [ChallengeType::Http01, ChallengeType::TlsAlpn01];
        let tls = Listeners {
            tls: true,
            plain: false,
        };
        let plain = Listeners {
            tls: false,
            plain: true,
        };
        let auto = AcmeChallenge::Auto;
        assert_eq!(pick(&both, auto, tls), Some(ChallengeType::TlsAlpn01));
        assert_eq!(pick(&both, auto, plain), Some(ChallengeType::Http01));
        assert_eq!(pick(&[ChallengeType::Http01], auto, tls), None);
        assert_eq!(
            pick(&both, AcmeChallenge::Http01, tls),
            Some(ChallengeType::Http01)
        );
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 254, 255])), Some(vec![0, 1, 254, 255]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }
}
