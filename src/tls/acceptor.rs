//! The OpenSSL acceptor of the TLS listeners: versions, ciphers, options, session
//! resumption and ALPN, and the SNI callback that hands each handshake the context of its
//! certificate.
//!
//! **Contexts.** Every certificate gets its own `SslContext` (chain and key loaded once);
//! the acceptor's context holds no certificate, only the settings and a servername
//! callback, which OpenSSL calls for every ClientHello (with or without SNI): it picks the
//! certificate ([`SniTable::pick`]) and switches the connection to that context, or
//! refuses the handshake with `unrecognized_name` when nothing serves the name and no
//! default is set. Versions and ciphers are copied into each connection from the
//! acceptor's context when it is created, so they hold whatever context is switched to;
//! ALPN is read from the switched-to context, so every context carries it.
//!
//! **Managed certificates** ([`super::managed`]) are looked up first, by exact name; a
//! client offering ALPN `acme-tls/1` for a host with a pending TLS-ALPN-01 challenge (a
//! CA validating it) is handed the challenge certificate in the ALPN callback, which
//! OpenSSL runs after the SNI callback and before it settles the certificate; such a
//! connection is closed after its handshake ([`crate::tls`] callers check
//! [`is_acme_validation`]).
//!
//! **Defaults.** TLS 1.2 and 1.3 only (1.3 only with `min_version: "1.3"`); for 1.2,
//! ECDHE key exchange with AES-GCM or ChaCha20-Poly1305 ([`DEFAULT_CIPHERS`], Mozilla's
//! "intermediate" list less its finite-field DHE suites), server preference, no
//! renegotiation, no compression. TLS 1.3's suites are OpenSSL's (all AEAD).
//!
//! **Resumption.** A session cache on the server and stateless tickets (both TLS 1.2 and
//! 1.3), keyed by the acceptor's context: a connection switched to a certificate's context
//! still resumes, since OpenSSL keeps sessions and ticket keys on the context the handshake
//! started in. A store rebuilt by a reload starts a new cache and new ticket keys (clients
//! make one full handshake); an unchanged store is kept, and its sessions with it.

use std::sync::{Arc, Weak};

use openssl::error::ErrorStack;
use openssl::ssl::{
    select_next_proto, AlpnError, NameType, SniError, SslAcceptor, SslAlert, SslContext,
    SslContextBuilder, SslMethod, SslOptions, SslRef, SslSessionCacheMode, SslVersion,
};

use crate::config::{Tls, TlsVersion};
use crate::tls::certs::LoadedCert;
use crate::tls::managed::{Managed, ACME_TLS_ALPN};
use crate::tls::sni::SniTable;

/// The TLS 1.2 cipher list used unless `tls.ciphers` says otherwise: forward secrecy and
/// AEAD only.
pub const DEFAULT_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

/// ALPN protocols offered, in preference order (wire format).
const ALPN: &[u8] = b"\x02h2\x08http/1.1";

/// The session ID context shared by every context, so that sessions resume across the
/// switch to a certificate's context.
const SESSION_ID_CONTEXT: &[u8] = b"tollgate";

/// Sessions kept in the server-side cache (OpenSSL's default is 20 480).
const SESSION_CACHE_SIZE: i32 = 20_480;

/// The settings every context shares.
fn configure(
    b: &mut SslContextBuilder,
    tls: &Tls,
    managed: Weak<Managed>,
) -> Result<(), ErrorStack> {
    let min = match tls.min_version {
        TlsVersion::V1_2 => SslVersion::TLS1_2,
        TlsVersion::V1_3 => SslVersion::TLS1_3,
    };
    b.set_min_proto_version(Some(min))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_cipher_list(tls.ciphers.as_deref().unwrap_or(DEFAULT_CIPHERS))?;
    b.set_options(
        SslOptions::CIPHER_SERVER_PREFERENCE
            | SslOptions::NO_RENEGOTIATION
            | SslOptions::NO_COMPRESSION,
    );
    b.set_session_id_context(SESSION_ID_CONTEXT)?;
    b.set_alpn_select_callback(move |ssl, offered| {
        if let Some(acme) = offered_protocol(offered, ACME_TLS_ALPN) {
            return answer_validation(ssl, &managed).map(|()| acme);
        }
        select_next_proto(ALPN, offered).ok_or(AlpnError::NOACK)
    });
    Ok(())
}

/// The protocol `wanted` within the client's ALPN list `offered` (wire format), if offered.
fn offered_protocol<'a>(offered: &'a [u8], wanted: &[u8]) -> Option<&'a [u8]> {
    let mut rest = offered;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        let proto = tail.get(..len)?;
        if proto == wanted {
            return Some(proto);
        }
        rest = &tail[len..];
    }
    None
}

/// Hands a TLS-ALPN-01 validation the challenge certificate of its SNI name; refused when
/// the name has no challenge pending.
fn answer_validation(ssl: &mut SslRef, managed: &Weak<Managed>) -> Result<(), AlpnError> {
    let challenge = managed.upgrade().and_then(|m| {
        let name = ssl.servername(NameType::HOST_NAME)?;
        m.alpn_challenge(name)
    });
    let Some(challenge) = challenge else {
        return Err(AlpnError::ALERT_FATAL);
    };
    ssl.set_certificate(&challenge.cert)
        .and_then(|()| ssl.set_private_key(&challenge.key))
        .map_err(|_| AlpnError::ALERT_FATAL)
}

/// Whether a finished handshake was a CA's TLS-ALPN-01 validation (nothing follows it: the
/// connection is closed).
pub fn is_acme_validation(ssl: &SslRef) -> bool {
    ssl.selected_alpn_protocol() == Some(ACME_TLS_ALPN)
}

/// A certificate's own context: the shared settings, its chain and its key.
pub(crate) fn cert_context(
    tls: &Tls,
    cert: &LoadedCert,
    managed: Weak<Managed>,
) -> Result<SslContext, ErrorStack> {
    let mut b = SslContext::builder(SslMethod::tls_server())?;
    configure(&mut b, tls, managed)?;
    let mut chain = cert.chain.iter();
    if let Some(leaf) = chain.next() {
        b.set_certificate(leaf)?;
    }
    for extra in chain {
        b.add_extra_chain_cert(extra.clone())?;
    }
    b.set_private_key(&cert.key)?;
    b.check_private_key()?;
    Ok(b.build())
}

/// The acceptor serving `managed`'s certificates by exact name, then `certs` by SNI
/// (`default`: the index of the certificate for no or an unknown name).
pub fn build(
    tls: &Tls,
    certs: &[LoadedCert],
    default: Option<usize>,
    managed: &Arc<Managed>,
) -> Result<SslAcceptor, ErrorStack> {
    let mut table = SniTable::new(default);
    let mut contexts = Vec::with_capacity(certs.len());
    for (i, cert) in certs.iter().enumerate() {
        contexts.push(cert_context(tls, cert, Arc::downgrade(managed))?);
        for name in &cert.names {
            table.insert(name, i);
        }
    }
    let contexts: Arc<[SslContext]> = contexts.into();
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
    configure(&mut b, tls, Arc::downgrade(managed))?;
    b.set_session_cache_mode(SslSessionCacheMode::SERVER);
    b.set_session_cache_size(SESSION_CACHE_SIZE);
    let managed = Arc::downgrade(managed);
    b.set_servername_callback(move |ssl, alert| {
        let name = ssl.servername(NameType::HOST_NAME);
        let live = managed.upgrade();
        if let Some(ctx) = name.zip(live.as_ref()).and_then(|(n, m)| m.context(n)) {
            return ssl.set_ssl_context(&ctx).map_err(|_| SniError::ALERT_FATAL);
        }
        let context = table.pick(name).and_then(|i| contexts.get(i));
        match context {
            Some(ctx) => ssl.set_ssl_context(ctx).map_err(|_| SniError::ALERT_FATAL),
            // A CA validating a host that has no certificate yet: the ALPN callback
            // hands it the challenge certificate.
            None if name
                .zip(live.as_ref())
                .is_some_and(|(n, m)| m.has_alpn_challenge(n)) =>
            {
                Ok(())
            }
            None => {
                *alert = SslAlert::UNRECOGNIZED_NAME;
                Err(SniError::ALERT_FATAL)
            }
        }
    });
    Ok(b.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_protocol_in_the_wire_list() {
        let offered = b"\x02h2\x0aacme-tls/1\x08http/1.1";
        assert_eq!(
            offered_protocol(offered, b"acme-tls/1"),
            Some(&b"acme-tls/1"[..])
        );
        assert_eq!(offered_protocol(offered, b"h3"), None);
        assert_eq!(
            offered_protocol(b"\x09short", b"short"),
            None,
            "a length past the end"
        );
    }
}
