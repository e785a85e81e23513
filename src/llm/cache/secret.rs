//! The warehouse's secret the cache signs its entries with: read or made once, a local file
//! readable by its owner only or an object of the warehouse's bucket, and the HMAC-SHA256 an
//! entry carries.

use super::*;

/// 32 random bytes.
#[derive(Clone, Copy)]
pub(super) struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why the cache's secret cannot be used (the cache is not, then), or an answer not kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unusable {
    #[error("{0} is not a regular file")]
    NotAFile(String),
    #[error(
        "{0} is not this user's alone (it must be owned by the user that runs batchinfer, with \
         mode 600: chmod 600 {0})"
    )]
    NotPrivate(String),
    #[error("{0} is not a secret batchinfer made")]
    NotASecret(String),
    #[error("{0}: it does not hold 64 hexadecimal digits")]
    NotHex(String),
    #[error("{place} could not be made: {error}")]
    NotMade { place: String, error: BoxError },
    #[error("{place}: {error}")]
    Unreadable { place: String, error: BoxError },
    #[error("{0} could not be read")]
    Vanished(String),
    /// A read whose error names what was read.
    #[error("{0}")]
    Read(BoxError),
    #[error("an answer could not be kept in the cache ({place}): {error}")]
    NotKept { place: String, error: BoxError },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Secret {
    /// 32 bytes from the system's random source (two version-4 UUIDs' worth).
    pub(super) fn new() -> Secret {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Secret(bytes)
    }

    /// The secret `text` holds, None where it does not hold 64 hexadecimal digits.
    pub(super) fn parse(text: &[u8]) -> Option<Secret> {
        let text = std::str::from_utf8(text).unwrap_or("").trim();
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Secret(bytes))
    }

    /// The signature of the entry keeping `reply` for `key`.
    pub(super) fn sign(&self, key: &str, reply: &str) -> String {
        let text = [key.as_bytes(), b"\n", reply.as_bytes()].concat();
        hex::encode(hmac_sha256(&self.0, &text))
    }
}

/// HMAC-SHA256 (RFC 2104) of `text` under `key` (at most 64 bytes).
pub(super) fn hmac_sha256(key: &[u8], text: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(text);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Whether `a` and `b` are equal, in a time that does not tell where they differ.
pub(super) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The secret in the local file `file`, made there if there is none: a regular file of its
/// owner's alone (not a link), or the cache is not used.
pub(super) fn local_secret(file: &std::path::Path) -> Result<Secret, Unusable> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let place = file.display().to_string();
    let unreadable = |e: std::io::Error| Unusable::Unreadable {
        place: place.clone(),
        error: e.into(),
    };
    for _ in 0..2 {
        match std::fs::symlink_metadata(file) {
            Ok(meta) => {
                if !meta.file_type().is_file() {
                    return Err(Unusable::NotAFile(place));
                }
                if meta.mode() & 0o077 != 0 || meta.uid() != unsafe { libc::geteuid() } {
                    return Err(Unusable::NotPrivate(place));
                }
                // Its error names the file already.
                let bytes = crate::storage::read_capped(file, 1024)
                    .map_err(|e| Unusable::Read(Box::new(e)))?;
                return Secret::parse(&bytes).ok_or(Unusable::NotHex(place));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let folder = file.parent().unwrap_or(std::path::Path::new("."));
                std::fs::create_dir_all(folder).map_err(unreadable)?;
                let draft = folder.join(format!(".{SECRET}.{}", uuid::Uuid::new_v4().simple()));
                let made = (|| {
                    let mut out = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&draft)?;
                    out.write_all(hex::encode(Secret::new().0).as_bytes())?;
                    out.sync_all()?;
                    // Never over another process's: the first one made is everyone's.
                    std::fs::hard_link(&draft, file)
                })();
                let _ = std::fs::remove_file(&draft);
                match made {
                    Ok(()) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        return Err(Unusable::NotMade {
                            place,
                            error: e.into(),
                        });
                    }
                }
            }
            Err(e) => return Err(unreadable(e)),
        }
    }
    Err(Unusable::Vanished(place))
}

impl Cache {
    /// Whether the warehouse has its secret already (an entry can be read only where it has):
    /// asked by an estimate, which makes none.
    pub async fn has_secret(&self) -> bool {
        if self.secret.initialized() {
            return true;
        }
        match &self.local {
            Some(root) => std::fs::symlink_metadata(root.with_file_name(SECRET)).is_ok(),
            None => self.store.head(&self.secret_path).await.is_ok(),
        }
    }

    /// The warehouse's secret, read or made once; None (said once) where it cannot be used.
    pub(super) async fn secret(&self) -> Option<Secret> {
        *self
            .secret
            .get_or_init(|| async {
                let secret = match &self.local {
                    Some(root) => {
                        let file = root.with_file_name(SECRET);
                        tokio::task::spawn_blocking(move || local_secret(&file))
                            .await
                            .unwrap_or_else(|e| {
                                Err(Unusable::Unreadable {
                                    place: SECRET.to_string(),
                                    error: e.into(),
                                })
                            })
                    }
                    None => self.remote_secret().await,
                };
                secret
                    .map_err(|e| {
                        crate::say!(
                            "warning: the LLM cache is not used: its secret cannot be used ({e})"
                        )
                    })
                    .ok()
            })
            .await
    }

    /// The secret as an object of the warehouse's store, made there (only where none is yet)
    /// if there is none.
    pub(super) async fn remote_secret(&self) -> Result<Secret, Unusable> {
        let place = format!(
            "{}{SECRET}",
            self.location.trim_end_matches('/').trim_end_matches(FOLDER)
        );
        for _ in 0..2 {
            match self.store.get(&self.secret_path).await {
                Ok(got) => {
                    if got.meta.size > 1024 {
                        return Err(Unusable::NotASecret(place));
                    }
                    let bytes = got.bytes().await.map_err(|e| Unusable::Unreadable {
                        place: place.clone(),
                        error: e.into(),
                    })?;
                    return Secret::parse(&bytes).ok_or(Unusable::NotHex(place));
                }
                Err(object_store::Error::NotFound { .. }) => {
                    let text = hex::encode(Secret::new().0);
                    let made = self
                        .store
                        .put_opts(
                            &self.secret_path,
                            text.into_bytes().into(),
                            object_store::PutMode::Create.into(),
                        )
                        .await;
                    match made {
                        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => continue,
                        Err(e) => {
                            return Err(Unusable::NotMade {
                                place,
                                error: e.into(),
                            });
                        }
                    }
                }
                Err(e) => {
                    return Err(Unusable::Unreadable {
                        place,
                        error: e.into(),
                    });
                }
            }
        }
        Err(Unusable::Vanished(place))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let secret = Secret([7; 32]);
        assert_ne!(secret.sign("k", "a"), secret.sign("k", "b"));
        assert_ne!(secret.sign("k", "a"), Secret([8; 32]).sign("k", "a"));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
