//! A model's versions and aliases: what `churn`, `churn@2` and `churn@champion` name.
//!
//! A model is a list of versions, numbered from 1 in the order they were added (a number is never
//! given twice, even after its version is dropped), and aliases, each naming one version.
//! `predict('churn', ...)` means the alias `default` where it is set, else the newest version;
//! `churn@2` version 2; `churn@champion` the version the alias names now.
//!
//! What follows the `@` is parsed here, never made into a path: a version is at most
//! [`MAX_VERSION_DIGITS`] digits without a leading zero, an alias a letter followed by letters,
//! digits and `_`; anything else (`../x`, `1/../2`, 300 digits) is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The alias `predict('name', ...)` follows where it is set.
pub const DEFAULT_ALIAS: &str = "default";

/// The most digits a version number has (versions count up to 999,999,999).
pub const MAX_VERSION_DIGITS: usize = 9;

/// The longest alias, in bytes.
pub const MAX_ALIAS_BYTES: usize = 64;

/// Which of a model's versions a reference picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// The alias `default` where it is set, else the newest version.
    Default,
    /// A version by its number.
    Version(u32),
    /// The version an alias names.
    Alias(String),
}

/// A model as SQL names it: `name`, `name@3` or `name@alias`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub name: String,
    pub pick: Pick,
}

impl ModelRef {
    /// Parses `text`: the model's name is checked as every name is; what follows `@` as a
    /// version or an alias ([`parse_pick`]).
    pub fn parse(text: &str) -> Result<ModelRef> {
        let (name, pick) = match text.split_once('@') {
            Some((name, after)) => (name, parse_pick(text, after)?),
            None => (text, Pick::Default),
        };
        crate::storage::check_name("model", name)?;
        Ok(ModelRef {
            name: name.to_string(),
            pick,
        })
    }
}

/// What follows the `@` of `text`: digits are a version number, a name an alias.
pub fn parse_pick(text: &str, after: &str) -> Result<Pick> {
    if !after.is_empty() && after.bytes().all(|b| b.is_ascii_digit()) {
        return version_number(after)
            .map(Pick::Version)
            .map_err(|why| refused(text, &why));
    }
    check_alias(after).map_err(|why| refused(text, &why))?;
    Ok(Pick::Alias(after.to_string()))
}

/// A version number, alias or list of versions that cannot be one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unusable {
    #[error("a version has at most {MAX_VERSION_DIGITS} digits, not {0}")]
    TooManyDigits(usize),
    #[error("a version is a number from 1, written without a leading zero")]
    LeadingZero,
    #[error("{0:?} is not a version number")]
    NotAVersion(String),
    #[error("the alias is empty")]
    EmptyAlias,
    #[error("an alias starts with a lower-case letter, not {0:?}")]
    AliasStart(char),
    #[error("an alias is at most {MAX_ALIAS_BYTES} bytes, this one {0}")]
    AliasTooLong(usize),
    #[error("an alias is lower-case letters, digits and '_', not {0:?}")]
    AliasCharacter(char),
    #[error("version {0} is not a version number")]
    OutOfRange(u32),
    #[error("version {0} is there twice")]
    Twice(u32),
    #[error("version {0}'s sha256 is not a sha256")]
    NotASha256(u32),
    #[error("alias {alias:?}: {why}")]
    Alias { alias: String, why: Box<Unusable> },
    #[error("alias {alias} names version {version}, which is not there")]
    AliasOfNone { alias: String, version: u32 },
}

/// A version number as written: 1 to 999,999,999, without a leading zero.
pub fn version_number(digits: &str) -> std::result::Result<u32, Unusable> {
    if digits.len() > MAX_VERSION_DIGITS {
        return Err(Unusable::TooManyDigits(digits.len()));
    }
    if digits.starts_with('0') {
        return Err(Unusable::LeadingZero);
    }
    digits
        .parse()
        .map_err(|_| Unusable::NotAVersion(digits.to_string()))
}

/// Refuses an alias that is not a lower-case letter followed by lower-case letters, digits and
/// `_`, or is too long (SQL makes a word lower case unless it is quoted: `SET ALIAS Champion`
/// sets `champion`, as `predict('m@champion', ...)` names it).
pub fn check_alias(alias: &str) -> std::result::Result<(), Unusable> {
    let mut chars = alias.chars();
    let why = match chars.next() {
        None => Some(Unusable::EmptyAlias),
        Some(c) if !c.is_ascii_lowercase() => Some(Unusable::AliasStart(c)),
        _ if alias.len() > MAX_ALIAS_BYTES => Some(Unusable::AliasTooLong(alias.len())),
        _ => chars
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
            .map(Unusable::AliasCharacter),
    };
    why.map_or(Ok(()), Err)
}

/// The largest version number ([`MAX_VERSION_DIGITS`] digits).
pub const MAX_VERSION: u32 = 999_999_999;

fn refused(text: &str, why: &Unusable) -> Error {
    Error::model(
        text,
        format!(
            "model '{text}' cannot be named: {why}; a model is named 'name', 'name@3' (its \
             version 3) or 'name@alias'"
        ),
    )
}

/// One registered version: the bytes it was registered with, by their sha256 (of an endpoint
/// model, its definition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub version: u32,
    /// The sha256 of its model file with its external data ([`crate::model::Model::sha256`]),
    /// or of an endpoint model's definition; absent in definitions written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The sha256 of the files beside it that change what it computes (a text model's
    /// tokenizer and settings, an image model's preprocessing), where it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beside_sha256: Option<String>,
    /// Where its bytes are kept (the warehouse's copy), or an endpoint model's URL.
    pub source: String,
    /// Where it was registered from, as the statement named it.
    pub origin: String,
    /// When it was added (RFC 3339, UTC).
    pub created: String,
    /// An endpoint model's definition ([`crate::llm::Endpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<serde_json::Value>,
}

impl Version {
    /// A version of the bytes of `sha256` kept at `source`, registered from `origin` now; its
    /// number is given when it is added ([`Versions::add`]).
    pub fn new(sha256: Option<String>, source: String, origin: String) -> Version {
        Version {
            version: 0,
            sha256,
            beside_sha256: None,
            source,
            origin,
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            endpoint: None,
        }
    }

    /// What a materialized view records of it ([`crate::model::Model::version`]).
    pub fn identity(&self) -> Option<String> {
        let sha256 = self.sha256.as_deref()?;
        Some(crate::model::version(sha256, self.beside_sha256.as_deref()))
    }
}

/// A model's versions and aliases.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    /// Oldest first.
    pub versions: Vec<Version>,
    /// Alias -> version number.
    pub aliases: BTreeMap<String, u32>,
    /// The number the next version gets.
    pub next: u32,
}

impl Versions {
    /// Adds `version` as the newest, numbered after every version there was; its number.
    pub fn add(&mut self, model: &str, mut version: Version) -> Result<u32> {
        let after = self.versions.iter().map(|v| v.version).max().unwrap_or(0);
        let number = self.next.max(after.saturating_add(1)).max(1);
        if number > MAX_VERSION {
            return Err(Error::model(
                model,
                format!(
                    "model '{model}' has had {MAX_VERSION} versions, the most a model has: \
                     register this one under another name"
                ),
            ));
        }
        self.next = number + 1;
        version.version = number;
        self.versions.push(version);
        Ok(number)
    }

    /// Refuses versions and aliases no statement could have made (a definition written by
    /// hand): a version numbered twice or out of range, an alias not a name or naming no
    /// version, a sha256 not one.
    pub fn check(&self) -> std::result::Result<(), Unusable> {
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.versions {
            if v.version == 0 || v.version > MAX_VERSION {
                return Err(Unusable::OutOfRange(v.version));
            }
            if !seen.insert(v.version) {
                return Err(Unusable::Twice(v.version));
            }
            let hex = |s: &str| {
                s.len() == 64
                    && s.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            };
            if v.sha256.as_deref().is_some_and(|s| !hex(s))
                || v.beside_sha256.as_deref().is_some_and(|s| !hex(s))
            {
                return Err(Unusable::NotASha256(v.version));
            }
        }
        for (alias, version) in &self.aliases {
            check_alias(alias).map_err(|why| Unusable::Alias {
                alias: alias.clone(),
                why: Box::new(why),
            })?;
            if !seen.contains(version) {
                return Err(Unusable::AliasOfNone {
                    alias: alias.clone(),
                    version: *version,
                });
            }
        }
        Ok(())
    }

    /// Points `alias` at `version`, which must be one there is.
    pub fn set_alias(&mut self, model: &str, alias: &str, version: u32) -> Result<()> {
        check_alias(alias).map_err(|why| refused(&format!("{model}@{alias}"), &why))?;
        self.version(model, version)?;
        self.aliases.insert(alias.to_string(), version);
        Ok(())
    }

    /// Removes `alias`, which must be set.
    pub fn drop_alias(&mut self, model: &str, alias: &str) -> Result<()> {
        match self.aliases.remove(alias) {
            Some(_) => Ok(()),
            None => Err(Error::model(
                model,
                format!(
                    "model '{model}' has no alias '{alias}' (its aliases: {})",
                    self.alias_list()
                ),
            )),
        }
    }

    /// Removes `version`: refused while an alias names it, or where it is the last one (DROP
    /// MODEL removes a model).
    pub fn drop_version(&mut self, model: &str, version: u32) -> Result<()> {
        self.version(model, version)?;
        let naming: Vec<&str> = self
            .aliases
            .iter()
            .filter(|(_, v)| **v == version)
            .map(|(a, _)| a.as_str())
            .collect();
        if !naming.is_empty() {
            return Err(Error::model(
                model,
                format!(
                    "version {version} of model '{model}' is named by the alias {}: move or drop \
                     it first (ALTER MODEL {model} DROP ALIAS {})",
                    naming.join(", "),
                    naming[0]
                ),
            ));
        }
        if self.versions.len() == 1 {
            return Err(Error::model(
                model,
                format!(
                    "version {version} is the only version of model '{model}': DROP MODEL {model} \
                     removes the model"
                ),
            ));
        }
        self.versions.retain(|v| v.version != version);
        Ok(())
    }

    /// The version `pick` names now.
    pub fn resolve(&self, model: &str, pick: &Pick) -> Result<&Version> {
        match pick {
            Pick::Version(n) => self.version(model, *n),
            Pick::Alias(alias) => match self.aliases.get(alias) {
                Some(n) => self.version(model, *n),
                None => Err(Error::model(
                    model,
                    format!(
                        "model '{model}' has no alias '{alias}' (its aliases: {})",
                        self.alias_list()
                    ),
                )),
            },
            Pick::Default => match self.aliases.get(DEFAULT_ALIAS) {
                Some(n) => self.version(model, *n),
                None => self
                    .versions
                    .last()
                    .ok_or_else(|| Error::model(model, format!("model '{model}' has no version"))),
            },
        }
    }

    /// The aliases naming `version`, in order of name.
    pub fn aliases_of(&self, version: u32) -> Vec<&str> {
        self.aliases
            .iter()
            .filter(|(_, v)| **v == version)
            .map(|(a, _)| a.as_str())
            .collect()
    }

    fn version(&self, model: &str, version: u32) -> Result<&Version> {
        self.versions
            .iter()
            .find(|v| v.version == version)
            .ok_or_else(|| {
                let there: Vec<String> = self
                    .versions
                    .iter()
                    .map(|v| v.version.to_string())
                    .collect();
                Error::model(
                    model,
                    format!(
                        "model '{model}' has no version {version} (its versions: {})",
                        there.join(", ")
                    ),
                )
            })
    }

    fn alias_list(&self) -> String {
        if self.aliases.is_empty() {
            return "none".into();
        }
        self.aliases
            .iter()
            .map(|(a, v)| format!("{a} -> {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_versions_and_aliases_are_parsed_never_made_into_paths() {
        let parsed = |t: &str| ModelRef::parse(t).map(|r| (r.name, r.pick));
        assert_eq!(parsed("churn").unwrap(), ("churn".into(), Pick::Default));
        assert_eq!(
            parsed("churn@2").unwrap(),
            ("churn".into(), Pick::Version(2))
        );
        assert_eq!(
            parsed("churn@champion").unwrap(),
            ("churn".into(), Pick::Alias("champion".into()))
        );
        let long = format!("churn@{}", "9".repeat(300));
        for hostile in [
            "churn@../x",
            "churn@1/../2",
            long.as_str(),
            "churn@",
            "churn@0",
            "churn@01",
            "churn@1@2",
            "churn@_x",
            "churn@Champion",
            "churn@a-b",
            "churn@a.b",
            "../churn@1",
            "@1",
            "churn@1000000000",
        ] {
            let refused = parsed(hostile);
            assert!(refused.is_err(), "{hostile}: {refused:?}");
        }
        let message = parsed(&long).unwrap_err().to_string();
        assert!(message.contains("at most 9 digits, not 300"), "{message}");
    }

    fn three() -> Versions {
        let mut v = Versions::default();
        for (i, sha) in ["a", "b", "c"].into_iter().enumerate() {
            let version = Version::new(Some(sha.into()), format!("s{i}"), "o".into());
            assert_eq!(v.add("m", version).unwrap(), i as u32 + 1);
        }
        v
    }

    fn sha(v: &Versions, pick: &Pick) -> String {
        v.resolve("m", pick).unwrap().sha256.clone().unwrap()
    }

    #[test]
    fn the_default_is_the_alias_default_else_the_newest() {
        let mut v = three();
        assert_eq!(sha(&v, &Pick::Default), "c");
        v.set_alias("m", DEFAULT_ALIAS, 1).unwrap();
        assert_eq!(sha(&v, &Pick::Default), "a");
        v.set_alias("m", "champion", 2).unwrap();
        assert_eq!(sha(&v, &Pick::Alias("champion".into())), "b");
        assert!(v.set_alias("m", "x", 9).is_err());
        assert!(v.resolve("m", &Pick::Alias("nope".into())).is_err());
        assert_eq!(v.aliases_of(1), vec![DEFAULT_ALIAS]);
    }

    #[test]
    fn a_named_version_is_not_dropped_and_numbers_are_never_given_twice() {
        let mut v = three();
        v.set_alias("m", "champion", 3).unwrap();
        let refused = v.drop_version("m", 3).unwrap_err().to_string();
        assert!(refused.contains("named by the alias champion"), "{refused}");
        v.drop_alias("m", "champion").unwrap();
        assert!(v.drop_alias("m", "champion").is_err());
        v.drop_version("m", 3).unwrap();
        assert_eq!(
            v.add("m", Version::new(None, "s".into(), "o".into()))
                .unwrap(),
            4
        );
        v.drop_version("m", 1).unwrap();
        v.drop_version("m", 2).unwrap();
        assert!(v.drop_version("m", 4).is_err(), "the last version stays");
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<Versions>(&json).unwrap(), v);
        // A number past the last, even where `next` says less; none past the largest.
        v.next = 2;
        assert_eq!(
            v.add("m", Version::new(None, "s".into(), "o".into()))
                .unwrap(),
            5
        );
        v.next = MAX_VERSION;
        v.add("m", Version::new(None, "s".into(), "o".into()))
            .unwrap();
        let refused = v.add("m", Version::new(None, "s".into(), "o".into()));
        assert!(refused.is_err(), "{refused:?}");
        v.next = u32::MAX;
        assert!(
            v.add("m", Version::new(None, "s".into(), "o".into()))
                .is_err()
        );
        // Written by hand: refused.
        let mut twice = v.clone();
        twice.versions.push(twice.versions[0].clone());
        assert!(twice.check().unwrap_err().to_string().contains("twice"));
        let mut dangling = v.clone();
        dangling.aliases.insert("x".into(), 77);
        assert!(
            dangling
                .check()
                .unwrap_err()
                .to_string()
                .contains("not there")
        );
        let mut hostile = v.clone();
        hostile.aliases.insert("../x".into(), 4);
        assert!(hostile.check().is_err());
        assert!(v.check().is_ok());
    }
}
