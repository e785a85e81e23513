//! Which version of a table a definition or a name reads: `OPTIONS ('version' | 'timestamp')`,
//! `VERSION AS OF`, `TIMESTAMP AS OF`.

use super::*;

/// Which version of a table a definition reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    /// The newest, as each query is planned.
    Newest,
    /// Version N (`OPTIONS ('version' 'N')`).
    Version(Version),
    /// The version current at a time (`OPTIONS ('timestamp' '2026-12-01T10:00:00Z')`).
    Time(chrono::DateTime<chrono::Utc>),
}

impl At {
    /// The version the `OPTIONS` of table `name` ask for; an option Delta tables do not take is
    /// refused, naming it.
    pub fn from_options(name: &str, options: &BTreeMap<String, String>) -> Result<At> {
        let mut at = At::Newest;
        for (key, value) in options {
            let setting =
                |problem: String| Error::setting(key, format!("table '{name}': {problem}"));
            match key.as_str() {
                "version" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "version" => {
                    let version = value.trim().parse::<Version>().map_err(|_| {
                        setting(format!(
                            "'version' is {value:?}; expected a version number (0, 1, ...)"
                        ))
                    })?;
                    at = At::Version(version);
                }
                "timestamp" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "timestamp" => {
                    let time = chrono::DateTime::parse_from_rfc3339(value.trim()).map_err(|e| {
                        setting(format!(
                            "'timestamp' is {value:?} ({e}); expected a time as RFC 3339 \
                             ('2026-12-01T10:00:00Z')"
                        ))
                    })?;
                    at = At::Time(time.with_timezone(&chrono::Utc));
                }
                other => {
                    return Err(setting(format!(
                        "a Delta table takes the options 'version' and 'timestamp' (and a \
                         store's settings), not '{other}'"
                    )));
                }
            }
        }
        Ok(at)
    }
}

impl At {
    /// The table and version a name of time travel gives (`t@v3`, `t@2026-12-03T10:00:00Z`:
    /// [`crate::statements::time_travel`]); None for any other name.
    pub fn of_name(name: &str) -> Option<(&str, Result<At>)> {
        let (table, at) = name.split_once('@')?;
        // A path or URL with an `@` in it is not a table's version.
        crate::storage::check_name("table", table).ok()?;
        let parsed = match at.strip_prefix('v') {
            Some(version) if version.bytes().all(|b| b.is_ascii_digit()) => version
                .parse::<Version>()
                .map(At::Version)
                .map_err(|_| Error::table(table, format!("'{version}' is not a version number"))),
            _ => chrono::DateTime::parse_from_rfc3339(at.trim())
                .map(|time| At::Time(time.with_timezone(&chrono::Utc)))
                .map_err(|e| {
                    Error::table(
                        table,
                        format!(
                            "TIMESTAMP AS OF '{at}' ({e}): expected a time as RFC 3339 \
                             ('2026-12-01T10:00:00Z')"
                        ),
                    )
                }),
        };
        Some((table, parsed))
    }
}
