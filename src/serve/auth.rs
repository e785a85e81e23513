//! Who is let in: a bearer token (`BATCHINFER_TOKEN`, `--token-file`), a username and password
//! (`--user`, `BATCHINFER_PASSWORD`, `--password-file`) given to Flight's handshake or with any
//! call, or anyone where neither is set. A client let in gets a session token of its own
//! (`authorization: Bearer ...` in the reply's headers), which names its session from then on.
//! Secrets are compared in constant time (their SHA-256 digests, byte by byte, whatever their
//! length) and never shown: not in messages, not in `Debug`.

use std::path::Path;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A secret: shown as `***`.
#[derive(Clone)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Secret {
    /// Whether `given` is this secret, in time that does not depend on where they differ.
    fn is(&self, given: &[u8]) -> bool {
        same_digest(self.0.as_bytes(), given)
    }
}

/// Whether `a` and `b` are the same bytes, comparing their SHA-256 digests in constant time.
pub fn same_digest(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The credentials the server lets clients in with.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    token: Option<Secret>,
    user: Option<(String, Secret)>,
}

/// The shortest token or password taken: a guessable one is refused at start.
const MIN_SECRET_CHARS: usize = 16;

/// The largest token or password file read.
const MAX_SECRET_BYTES: u64 = 4096;

impl Credentials {
    /// The credentials of the command line: a token (`token`: BATCHINFER_TOKEN's value, or
    /// `token_file`'s first line), and a user with a password (`password`:
    /// BATCHINFER_PASSWORD's value, or `password_file`'s first line).
    pub fn new(
        token: Option<String>,
        token_file: Option<&Path>,
        user: Option<String>,
        password: Option<String>,
        password_file: Option<&Path>,
    ) -> Result<Self> {
        let token = secret(
            "token",
            token,
            token_file,
            "BATCHINFER_TOKEN",
            "--token-file",
        )?;
        let password = secret(
            "password",
            password,
            password_file,
            "BATCHINFER_PASSWORD",
            "--password-file",
        )?;
        let user = match (user, password) {
            (Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') {
                    return Err(Error::Usage(
                        "--user must be a name without ':' (Basic authentication splits there)"
                            .to_string(),
                    ));
                }
                Some((user, password))
            }
            (Some(user), None) => {
                return Err(Error::Usage(format!(
                    "--user {user} needs a password: BATCHINFER_PASSWORD or --password-file"
                )));
            }
            (None, Some(_)) => {
                return Err(Error::Usage(
                    "a password (BATCHINFER_PASSWORD or --password-file) needs --user".to_string(),
                ));
            }
            (None, None) => None,
        };
        Ok(Credentials { token, user })
    }

    /// Whether clients must show a credential.
    pub fn required(&self) -> bool {
        self.token.is_some() || self.user.is_some()
    }

    /// How clients are let in, for the line the server starts with.
    pub fn describe(&self) -> String {
        match (&self.token, &self.user) {
            (Some(_), Some((user, _))) => {
                format!("a bearer token, or user {user} with its password")
            }
            (Some(_), None) => "a bearer token".to_string(),
            (None, Some((user, _))) => format!("user {user} with its password"),
            (None, None) => "no authentication".to_string(),
        }
    }

    /// What an `authorization` header's value shows: a credential of the server's (a new
    /// session is then given), a session token, or nothing valid.
    pub fn check(&self, header: Option<&str>) -> Shown {
        let Some(header) = header.map(str::trim) else {
            return if self.required() {
                Shown::Refused(
                    "no credentials: send `authorization: Bearer <token>` (the server's \
                     BATCHINFER_TOKEN), or log in with the server's user and password",
                )
            } else {
                Shown::Credential
            };
        };
        if let Some(token) = strip_scheme(header, "bearer") {
            if self.token.as_ref().is_some_and(|t| t.is(token.as_bytes())) {
                return Shown::Credential;
            }
            return Shown::Session(token.to_string());
        }
        if let Some(basic) = strip_scheme(header, "basic") {
            // Padded or not: Go's Flight client (ADBC's driver) sends it unpadded.
            let decoded = BASIC
                .decode(basic.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
                return Shown::Refused("the Basic credentials are not base64 of user:password");
            };
            return match &self.user {
                Some((name, secret)) => {
                    // Both compared, whichever differs, in the same time.
                    let name_ok = same_digest(name.as_bytes(), user.as_bytes());
                    let password_ok = secret.is(password.as_bytes());
                    if name_ok & password_ok {
                        Shown::Credential
                    } else {
                        Shown::Refused("wrong user or password")
                    }
                }
                None if !self.required() => Shown::Credential,
                None => {
                    Shown::Refused("this server takes no user and password: send its bearer token")
                }
            };
        }
        Shown::Refused("the authorization header is neither `Bearer <token>` nor `Basic ...`")
    }
}

/// Standard base64, with or without its `=` padding.
const BASIC: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// What a call's credentials show ([`Credentials::check`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// The server's token, user and password, or none where none is needed: a new session.
    Credential,
    /// A bearer token that is not the server's: a session's, if it names one.
    Session(String),
    /// Why the call is refused.
    Refused(&'static str),
}

/// `header` without its scheme (`Bearer `, `Basic `, in any case).
fn strip_scheme<'h>(header: &'h str, scheme: &str) -> Option<&'h str> {
    let (given, rest) = header.split_once(' ')?;
    given.eq_ignore_ascii_case(scheme).then_some(rest.trim())
}

/// A secret from the environment's `value` or `file`'s first line; None where neither is given.
fn secret(
    what: &str,
    value: Option<String>,
    file: Option<&Path>,
    variable: &str,
    flag: &str,
) -> Result<Option<Secret>> {
    let (text, from) = match (value, file) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage(format!(
                "the {what} is given twice: {variable} and {flag}; give one"
            )));
        }
        (Some(value), None) => (value, variable.to_string()),
        (None, Some(path)) => {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(MAX_SECRET_BYTES).read_to_string(&mut text))
                .map_err(|e| Error::io(format!("reading the {what} in {}", path.display()), e))?;
            let first = text.lines().next().unwrap_or("").trim().to_string();
            (first, format!("{flag} {}", path.display()))
        }
        (None, None) => return Ok(None),
    };
    if text.chars().count() < MIN_SECRET_CHARS {
        return Err(Error::Usage(format!(
            "the {what} of {from} is shorter than {MIN_SECRET_CHARS} characters: make a longer \
             one (e.g. `openssl rand -hex 32`)"
        )));
    }
    if text.chars().any(char::is_control) || text.starts_with(' ') || text.ends_with(' ') {
        return Err(Error::Usage(format!(
            "the {what} of {from} has control characters or spaces at its ends, which no \
             header carries"
        )));
    }
    Ok(Some(Secret(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token() -> Credentials {
        Credentials::new(Some("t".repeat(20)), None, None, None, None).unwrap()
    }

    #[test]
    fn the_token_and_only_it_lets_in() {
        let c = with_token();
        let token = format!("Bearer {}", "t".repeat(20));
        assert_eq!(c.check(Some(&token)), Shown::Credential);
        assert_eq!(c.check(Some(&token.to_lowercase())), Shown::Credential);
        assert!(matches!(c.check(Some("Bearer nope")), Shown::Session(_)));
        assert!(matches!(c.check(None), Shown::Refused(_)));
        assert!(matches!(c.check(Some("Basic dTpw")), Shown::Refused(_)));
    }

    #[test]
    fn user_and_password() {
        let c =
            Credentials::new(None, None, Some("ana".into()), Some("p".repeat(16)), None).unwrap();
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert_eq!(
            c.check(Some(&basic("ana", &"p".repeat(16)))),
            Shown::Credential
        );
        assert!(matches!(
            c.check(Some(&basic("ana", "x"))),
            Shown::Refused(_)
        ));
        assert!(matches!(
            c.check(Some(&basic("bob", &"p".repeat(16)))),
            Shown::Refused(_)
        ));
        // Unpadded, as Go's Flight client sends it ("ana:" + 16 bytes needs padding).
        let unpadded = basic("ana", &"p".repeat(16));
        assert!(unpadded.ends_with('='));
        let unpadded = unpadded.trim_end_matches('=');
        assert_eq!(c.check(Some(unpadded)), Shown::Credential);
    }

    #[test]
    fn short_or_doubled_secrets_are_refused_and_never_shown() {
        let short = Credentials::new(Some("abcxyz".into()), None, None, None, None).unwrap_err();
        assert!(!short.to_string().contains("abcxyz"), "{short}");
        assert!(Credentials::new(None, None, Some("ana".into()), None, None).is_err());
        let c = with_token();
        assert!(!format!("{c:?}").contains("tttt"));
    }

    #[test]
    fn no_credentials_needed_where_none_are_set() {
        let c = Credentials::default();
        assert_eq!(c.check(None), Shown::Credential);
        assert!(matches!(c.check(Some("Bearer abc")), Shown::Session(_)));
    }
}
