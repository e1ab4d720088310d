//! Where the ACME account and the certificates live, so that a restart reuses them
//! instead of ordering again (a CA's rate limits count orders).
//!
//! - **A directory** (`storage: DIR`): `DIR/CA/account.json` (the account's key and URL,
//!   as instant-acme serializes them), `DIR/CA/HOST.crt` (the chain, leaf first) and
//!   `DIR/CA/HOST.key`, where `CA` is the directory URL's host (and port), so that staging
//!   and production never mix. Directories are made 0700, files written 0600 to a
//!   temporary file in the same directory, synced and renamed over the old one: a crash
//!   leaves the old file or the new one, never half of one.
//! - **A Redis store** (`store: NAME`): the same three things under
//!   `PREFIXacme:CA:account`, `PREFIXacme:CA:cert:HOST` (chain and key, one JSON value),
//!   plus `PREFIXacme:CA:lock` (the fleet's order lock: one instance orders at a time, so
//!   the others are free to answer its challenge; `SET NX PX` with a random token, released
//!   only by its holder) and `PREFIXacme:CA:gen` (bumped at every certificate
//!   written, so that the fleet notices in one read), and `PREFIXacme:CA:challenge:HOST`
//!   (the pending challenge, for the instances the CA's validation reaches).
//!
//! Every Redis call has a deadline ([`REDIS_TIMEOUT`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

use crate::config::{secret, Acme, AcmeStorage, Config, RedisEndpoint};

/// The deadline of one Redis call.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an order's lock is held at most (an order that takes longer lets another
/// instance try).
pub const LOCK_TTL: Duration = Duration::from_secs(600);

/// A certificate as stored: PEM texts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The chain, leaf first.
    pub chain: String,
    /// The private key (PKCS#8 PEM).
    pub key: String,
}

/// A pending challenge, shared with the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedChallenge {
    /// TLS-ALPN-01: the key authorization's SHA-256, hex.
    pub alpn_digest: Option<String>,
    /// HTTP-01: the token and its key authorization.
    pub http: Option<(String, String)>,
}

/// Why storage failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file or directory.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Redis.
    #[error("store `{store}`: {what}")]
    Redis {
        /// The store.
        store: String,
        /// What failed.
        what: String,
    },
    /// A stored value does not parse.
    #[error("{what}: {source}")]
    Json {
        /// Which value.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
}

/// The account and certificates' home.
pub enum Storage {
    /// `DIR/CA`.
    Dir(PathBuf),
    /// A Redis store.
    Redis(Box<RedisStorage>),
}

/// A Redis store's connection (opened at first use) and key names.
pub struct RedisStorage {
    store: String,
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    prefix: String,
}

/// The CA's name in paths and keys: the directory URL's host and port, in `[a-z0-9.-_]`.
pub fn ca_name(directory: &str) -> String {
    let parsed = url::Url::parse(directory).ok();
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "ca".to_string());
    let port = parsed.as_ref().and_then(url::Url::port);
    let name = match port {
        Some(p) => format!("{host}_{p}"),
        None => host,
    };
    name.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Storage {
    /// The storage `acme` names in `config`.
    pub fn open(acme: &Acme, config: &Config) -> Result<Storage, StorageError> {
        let ca = ca_name(&acme.directory);
        match &acme.storage {
            AcmeStorage::Dir(dir) => Ok(Storage::Dir(dir.join(ca))),
            AcmeStorage::Store(name) => {
                let err = |what: String| StorageError::Redis {
                    store: name.clone(),
                    what,
                };
                let spec = config
                    .stores
                    .iter()
                    .find(|s| &s.name == name)
                    .ok_or_else(|| err("no such store".to_string()))?;
                let RedisEndpoint::Standalone(url) = &spec.redis.endpoint else {
                    return Err(err("a Redis Cluster; ACME takes a standalone Redis".into()));
                };
                let url = match &spec.redis.password {
                    Some(p) => secret::with_password(url, &p.value).unwrap_or_else(|| url.clone()),
                    None => url.clone(),
                };
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| err(format!("its URL is refused: {e}")))?;
                Ok(Storage::Redis(Box::new(RedisStorage {
                    store: name.clone(),
                    client,
                    conn: tokio::sync::Mutex::new(None),
                    prefix: format!("{}acme:{ca}:", spec.redis.tuning.prefix),
                })))
            }
        }
    }

    /// Whether a fleet shares it (orders take the lock, challenges are published).
    pub fn shared(&self) -> bool {
        matches!(self, Storage::Redis(_))
    }

    /// What the expiry gauge calls the certificate of `host`.
    pub fn label(&self, host: &str) -> PathBuf {
        match self {
            Storage::Dir(dir) => dir.join(format!("{host}.crt")),
            Storage::Redis(r) => crate::tls::managed::store_label(&r.store, host),
        }
    }

    /// The account's serialized credentials, if stored.
    pub async fn load_account(&self) -> Result<Option<String>, StorageError> {
        match self {
            Storage::Dir(dir) => read_opt(&dir.join("account.json")),
            Storage::Redis(r) => r.get("account").await,
        }
    }

    /// Stores the account's credentials unless one is there already (another instance
    /// made it first); the credentials to use.
    pub async fn save_account(&self, json: &str) -> Result<String, StorageError> {
        match self {
            Storage::Dir(dir) => {
                write_atomic(&dir.join("account.json"), json.as_bytes())?;
                Ok(json.to_string())
            }
            Storage::Redis(r) => {
                let set: Option<String> = r
                    .query(redis::cmd("SET").arg(r.key("account")).arg(json).arg("NX"))
                    .await?;
                if set.is_some() {
                    return Ok(json.to_string());
                }
                Ok(r.get("account").await?.unwrap_or_else(|| json.to_string()))
            }
        }
    }

    /// Forgets the account (the CA no longer knows it).
    pub async fn forget_account(&self) -> Result<(), StorageError> {
        match self {
            Storage::Dir(dir) => {
                let path = dir.join("account.json");
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(StorageError::Io { path, source: e })
                    }
                    _ => Ok(()),
                }
            }
            Storage::Redis(r) => {
                let _: i64 = r.query(redis::cmd("DEL").arg(r.key("account"))).await?;
                Ok(())
            }
        }
    }

    /// The stored certificate of `host`, if any.
    pub async fn load_cert(&self, host: &str) -> Result<Option<Stored>, StorageError> {
        match self {
            Storage::Dir(dir) => {
                let (crt, key) = (
                    dir.join(format!("{host}.crt")),
                    dir.join(format!("{host}.key")),
                );
                match (read_opt(&crt)?, read_opt(&key)?) {
                    (Some(chain), Some(key)) => Ok(Some(Stored { chain, key })),
                    _ => Ok(None),
                }
            }
            Storage::Redis(r) => match r.get(&format!("cert:{host}")).await? {
                Some(json) => {
                    serde_json::from_str(&json)
                        .map(Some)
                        .map_err(|source| StorageError::Json {
                            what: format!("the stored certificate of {host}"),
                            source,
                        })
                }
                None => Ok(None),
            },
        }
    }

    /// Stores the certificate of `host` (the key first on disk: a crash between the two
    /// leaves a key that does not match the old chain, which the next start refuses and
    /// orders again, rather than a chain without its key).
    pub async fn save_cert(&self, host: &str, cert: &Stored) -> Result<(), StorageError> {
        match self {
            Storage::Dir(dir) => {
                write_atomic(&dir.join(format!("{host}.key")), cert.key.as_bytes())?;
                write_atomic(&dir.join(format!("{host}.crt")), cert.chain.as_bytes())
            }
            Storage::Redis(r) => {
                let json = serde_json::to_string(cert).map_err(|source| StorageError::Json {
                    what: format!("the certificate of {host}"),
                    source,
                })?;
                let mut pipe = redis::pipe();
                pipe.atomic()
                    .cmd("SET")
                    .arg(r.key(&format!("cert:{host}")))
                    .arg(json)
                    .ignore()
                    .cmd("INCR")
                    .arg(r.key("gen"))
                    .ignore();
                let () = r.query_pipe(&pipe).await?;
                Ok(())
            }
        }
    }

    /// The fleet's certificate generation (bumped at each write); `None` for a directory.
    pub async fn generation(&self) -> Result<Option<i64>, StorageError> {
        match self {
            Storage::Dir(_) => Ok(None),
            Storage::Redis(r) => Ok(Some(
                r.get("gen")
                    .await?
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0),
            )),
        }
    }

    /// Takes the fleet's order lock (to order `host`) with `token`; `false`: another
    /// instance holds it. A directory has no fleet: always `true`.
    pub async fn lock(&self, host: &str, token: &str) -> Result<bool, StorageError> {
        log::debug!("tls.acme: {host}: taking the order lock");
        match self {
            Storage::Dir(_) => Ok(true),
            Storage::Redis(r) => {
                let set: Option<String> = r
                    .query(
                        redis::cmd("SET")
                            .arg(r.key("lock"))
                            .arg(token)
                            .arg("NX")
                            .arg("PX")
                            .arg(LOCK_TTL.as_millis() as u64),
                    )
                    .await?;
                Ok(set.is_some())
            }
        }
    }

    /// Releases the fleet's order lock (taken for `host`) if `token` still holds it.
    pub async fn unlock(&self, host: &str, token: &str) -> Result<(), StorageError> {
        log::debug!("tls.acme: {host}: releasing the order lock");
        let Storage::Redis(r) = self else {
            return Ok(());
        };
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
        );
        let mut inv = script.key(r.key("lock"));
        inv.arg(token);
        let mut conn = r.conn().await?;
        let done: Result<Result<i64, _>, _> =
            tokio::time::timeout(REDIS_TIMEOUT, inv.invoke_async(&mut conn)).await;
        r.check(done).map(|_| ())
    }

    /// Publishes the pending challenge of `host` for the fleet (expires with the lock).
    pub async fn publish_challenge(
        &self,
        host: &str,
        challenge: &SharedChallenge,
    ) -> Result<(), StorageError> {
        let Storage::Redis(r) = self else {
            return Ok(());
        };
        let json = serde_json::to_string(challenge).map_err(|source| StorageError::Json {
            what: format!("the challenge of {host}"),
            source,
        })?;
        let _: Option<String> = r
            .query(
                redis::cmd("SET")
                    .arg(r.key(&format!("challenge:{host}")))
                    .arg(json)
                    .arg("PX")
                    .arg(LOCK_TTL.as_millis() as u64),
            )
            .await?;
        Ok(())
    }

    /// The challenge another instance published for `host`.
    pub async fn load_challenge(
        &self,
        host: &str,
    ) -> Result<Option<SharedChallenge>, StorageError> {
        let Storage::Redis(r) = self else {
            return Ok(None);
        };
        match r.get(&format!("challenge:{host}")).await? {
            Some(json) => Ok(serde_json::from_str(&json).ok()),
            None => Ok(None),
        }
    }

    /// Removes the published challenge of `host`.
    pub async fn clear_challenge(&self, host: &str) -> Result<(), StorageError> {
        let Storage::Redis(r) = self else {
            return Ok(());
        };
        let _: i64 = r
            .query(redis::cmd("DEL").arg(r.key(&format!("challenge:{host}"))))
            .await?;
        Ok(())
    }
}

impl RedisStorage {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn err(&self, what: impl std::fmt::Display) -> StorageError {
        StorageError::Redis {
            store: self.store.clone(),
            what: what.to_string(),
        }
    }

    /// The connection, opened at first use (again after a failure).
    async fn conn(&self) -> Result<MultiplexedConnection, StorageError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let opened = tokio::time::timeout(
            REDIS_TIMEOUT,
            self.client.get_multiplexed_async_connection(),
        )
        .await;
        let conn = match opened {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.err(format!("cannot connect: {e}"))),
            Err(_) => return Err(self.err("cannot connect within 5s")),
        };
        *slot = Some(conn.clone());
        Ok(conn)
    }

    fn check<T>(
        &self,
        done: Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StorageError> {
        match done {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.err(e)),
            Err(_) => Err(self.err("no answer within 5s")),
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StorageError> {
        let mut conn = self.conn().await?;
        let done = tokio::time::timeout(REDIS_TIMEOUT, cmd.query_async(&mut conn)).await;
        let out = self.check(done);
        if out.is_err() {
            *self.conn.lock().await = None;
        }
        out
    }

    async fn query_pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StorageError> {
        let mut conn = self.conn().await?;
        let done = tokio::time::timeout(REDIS_TIMEOUT, pipe.query_async(&mut conn)).await;
        let out = self.check(done);
        if out.is_err() {
            *self.conn.lock().await = None;
        }
        out
    }

    async fn get(&self, name: &str) -> Result<Option<String>, StorageError> {
        self.query(redis::cmd("GET").arg(self.key(name))).await
    }
}

/// A file's text, `None` if it does not exist.
fn read_opt(path: &Path) -> Result<Option<String>, StorageError> {
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() as u64 > crate::tls::certs::MAX_PEM_BYTES => {
            Err(StorageError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("too large"),
            })
        }
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StorageError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `bytes` to `path` atomically, mode 0600, its directory made 0700 if missing.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StorageError::Io { path: p, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    // tempfile creates its files 0600.
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(path))?;
    tmp.write_all(bytes).map_err(io(path))?;
    tmp.as_file().sync_all().map_err(io(path))?;
    tmp.persist(path).map_err(|e| StorageError::Io {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_names_keep_staging_apart() {
        assert_eq!(
            ca_name("https://acme-staging-v02.api.letsencrypt.org/directory"),
            "acme-staging-v02.api.letsencrypt.org"
        );
        assert_eq!(ca_name("https://127.0.0.1:14000/dir"), "127.0.0.1_14000");
        assert_eq!(ca_name("https://[::1]:14000/dir"), "___1__14000");
    }

    #[test]
    fn atomic_writes_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca/a.example.com.key");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temporary left"
        );
    }
}
