//! PostgreSQL tables: where to connect (the statement's `OPTIONS`, a `postgres://` URL, the
//! `PG*` variables libpq reads, in that order), the connection pool, and the table's provider.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::TableProvider;
use datafusion::catalog::TableProviderFactory;
use datafusion::common::TableReference;
use datafusion::logical_expr::CreateExternalTable;
use datafusion_table_providers_postgres::pool::PostgresConnectionPool;
use datafusion_table_providers_postgres::{PostgresTableFactory, PostgresTableProviderFactory};
use secrecy::SecretString;
use url::Url;

use super::{Database, table_reference, unknown_option, without};
use crate::error::{Error, Result};

/// The options a PostgreSQL table takes.
const KNOWN: &[&str] = &[
    "url",
    "host",
    "port",
    "db",
    "user",
    "pass",
    "sslmode",
    "sslrootcert",
];

/// Where a table is, as libpq's settings: `host`, `port`, `db`, `user`, `pass`, `sslmode`,
/// `sslrootcert`.
#[derive(Default)]
struct Settings(BTreeMap<&'static str, String>);

impl Settings {
    /// The statement's options, over those of its `'url'`, over the `PG*` variables, over
    /// libpq's defaults.
    fn resolve(options: &BTreeMap<String, String>) -> Result<Settings> {
        let mut settings = Settings::default();
        let from_env = [
            ("host", "PGHOST"),
            ("port", "PGPORT"),
            ("db", "PGDATABASE"),
            ("user", "PGUSER"),
            ("pass", "PGPASSWORD"),
            ("sslmode", "PGSSLMODE"),
            ("sslrootcert", "PGSSLROOTCERT"),
        ];
        for (key, variable) in from_env {
            if let Ok(value) = std::env::var(variable) {
                settings.0.insert(key, value);
            }
        }
        if let Some(url) = options.get("url") {
            settings.read_url(url)?;
        }
        for (key, value) in options {
            let key = match key.as_str() {
                "url" => continue,
                "password" => "pass",
                "dbname" | "database" => "db",
                key => KNOWN
                    .iter()
                    .copied()
                    .find(|k| *k == key)
                    .ok_or_else(|| unknown_option(Database::Postgres, key, KNOWN))?,
            };
            settings.0.insert(key, value.clone());
        }
        let user = settings
            .0
            .get("user")
            .cloned()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "postgres".into());
        settings
            .0
            .entry("host")
            .or_insert_with(|| "localhost".into());
        settings.0.entry("port").or_insert_with(|| "5432".into());
        settings.0.entry("db").or_insert_with(|| user.clone());
        settings.0.entry("user").or_insert(user);
        // libpq's default: TLS when the server offers it.
        settings
            .0
            .entry("sslmode")
            .or_insert_with(|| "prefer".into());
        // The provider joins them into a libpq `key=value` string, unquoted.
        for key in ["host", "port", "db", "user", "sslmode", "sslrootcert"] {
            if settings
                .get(key)
                .contains(|c: char| c.is_whitespace() || c == '\'' || c == '"')
            {
                return Err(Error::setting(
                    key,
                    format!(
                        "the PostgreSQL setting '{key}' has a space or a quote, which the connection \
                     cannot take"
                    ),
                ));
            }
        }
        Ok(settings)
    }

    /// `postgres://user:pass@host:port/db?sslmode=...`.
    fn read_url(&mut self, text: &str) -> Result<()> {
        let shown = crate::storage::blank_passwords(text);
        // Not quoted unless it is a URL: a libpq key=value string would show its password.
        let url = Url::parse(text).map_err(|e| {
            Error::setting(
                "url",
                format!(
                    "the 'url' option is not a postgres:// URL ({e}): expected \
                 postgres://USER@HOST:PORT/DB (a password after the user, or in 'pass')"
                ),
            )
        })?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(Error::setting(
                "url",
                format!(
                    "'{shown}' is not a postgres:// URL (postgres://USER@HOST:PORT/DB; a password \
                 after the user, or in 'pass')"
                ),
            ));
        }
        let decode = |s: &str| {
            percent_decode(s)
                .ok_or_else(|| Error::setting("url", format!("'{shown}' is not well encoded")))
        };
        if let Some(host) = url.host_str().filter(|h| !h.is_empty()) {
            self.0
                .insert("host", host.trim_matches(['[', ']']).to_string());
        }
        if let Some(port) = url.port() {
            self.0.insert("port", port.to_string());
        }
        if !url.username().is_empty() {
            self.0.insert("user", decode(url.username())?);
        }
        if let Some(pass) = url.password() {
            self.0.insert("pass", decode(pass)?);
        }
        if let Some(db) = url.path().strip_prefix('/').filter(|d| !d.is_empty()) {
            self.0.insert("db", decode(db)?);
        }
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "sslmode" => self.0.insert("sslmode", value.into_owned()),
                "sslrootcert" => self.0.insert("sslrootcert", value.into_owned()),
                other => {
                    return Err(Error::setting(
                        "url",
                        format!(
                            "'{shown}': batchinfer reads no '{other}' from a postgres:// URL (it \
                         reads sslmode and sslrootcert)"
                        ),
                    ));
                }
            };
        }
        Ok(())
    }

    fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Where it connects, for messages: `user@host:port/db`.
    fn describe(&self) -> String {
        format!(
            "{}@{}:{}/{}",
            self.get("user"),
            self.get("host"),
            self.get("port"),
            self.get("db")
        )
    }

    fn params(&self) -> HashMap<String, SecretString> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), SecretString::from(v.clone())))
            .collect()
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(super) async fn table(
    name: &str,
    create: &CreateExternalTable,
    options: BTreeMap<String, String>,
) -> Result<Arc<dyn TableProvider>> {
    let settings = Settings::resolve(&options)?;
    let pass = settings.get("pass").to_string();
    let reference = table_reference(super::location(create)?, name);
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::database(
            "PostgreSQL",
            name,
            without(
                &format!(
                    "PostgreSQL table '{name}' ({reference} at {}): {what}: {e}",
                    settings.describe()
                ),
                &[&pass],
            ),
        )
    };
    let declared = !create.schema.fields().is_empty();
    if declared && reference.schema().is_some() {
        return Err(Error::database(
            "PostgreSQL",
            name,
            format!(
                "PostgreSQL table '{name}': a table with declared columns is created in the search \
             path's schema, so its LOCATION names no schema ('{}'); create it in '{reference}' \
             with psql and leave the columns out",
                reference.table()
            ),
        ));
    }
    let connect = async {
        if declared {
            create_declared(create, &reference, &settings)
                .await
                .map_err(|e| failed("cannot create it", &e))?;
        }
        let pool = PostgresConnectionPool::new(settings.params())
            .await
            .map_err(|e| failed("cannot connect", &e))?;
        let located = locate(&pool, &reference, &failed).await?;
        let provider = PostgresTableFactory::new(Arc::new(pool))
            .read_write_table_provider(located)
            .await
            .map_err(|e| failed("cannot read the table's columns", &e))?;
        if declared && let Some(why) = other_columns(&provider.schema(), create.schema.as_arrow()) {
            return Err(failed("the table exists with other columns", &why));
        }
        Ok(provider)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| {
            failed(
                "no answer",
                &format!(
                    "the server did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            )
        })?
}

/// The table `reference` names, looked up by name (as parameters) before the provider reads its columns:
/// the provider falls back to `SELECT * FROM <LOCATION>` for a name its catalog query
/// does not find, which would run whatever the LOCATION says. A bare name is the table
/// the search path finds, named with its schema from then on (the provider reads a bare
/// name's columns from `public`, its rows through the search path).
async fn locate(
    pool: &PostgresConnectionPool,
    reference: &TableReference,
    failed: &(dyn Fn(&str, &dyn std::fmt::Display) -> Error + Sync),
) -> Result<TableReference> {
    let connection = pool
        .connect_direct()
        .await
        .map_err(|e| failed("cannot connect", &e))?;
    let schema = reference.schema().map(str::to_string);
    let table = reference.table().to_string();
    let found = connection
        .conn
        .query_opt(TABLE_SCHEMA, &[&schema, &table])
        .await
        .map_err(|e| failed("cannot look the table up", &e))?;
    let Some(found) = found else {
        return Err(failed(
            "no such table",
            &format!(
                "the database has no table or view '{}'{}",
                table,
                match &schema {
                    Some(schema) => format!(" in schema '{schema}'"),
                    None => " in the search path".to_string(),
                }
            ),
        ));
    };
    Ok(TableReference::partial(found.get::<_, String>(0), table))
}

/// Creates a table with declared columns where it does not exist (in the search path's schema),
/// by the provider's own factory; its columns are then read back as for any table, and compared.
async fn create_declared(
    create: &CreateExternalTable,
    reference: &TableReference,
    settings: &Settings,
) -> datafusion::error::Result<()> {
    let mut create = create.clone();
    create.name = datafusion::common::TableReference::bare(reference.table());
    create.options = settings
        .0
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let state = datafusion::execution::SessionStateBuilder::new().build();
    PostgresTableProviderFactory::new()
        .create(&state, &create)
        .await
        .map(drop)
}

/// How the columns a table `has` differ from those a statement `wants`, if they do.
fn other_columns(
    has: &datafusion::arrow::datatypes::Schema,
    wants: &datafusion::arrow::datatypes::Schema,
) -> Option<String> {
    let columns = |schema: &datafusion::arrow::datatypes::Schema| {
        schema
            .fields()
            .iter()
            .map(|f| {
                // Text is text, however Arrow holds it.
                let data_type = match f.data_type() {
                    DataType::Utf8View | DataType::LargeUtf8 => &DataType::Utf8,
                    other => other,
                };
                format!("{} {data_type}", f.name())
            })
            .collect::<Vec<_>>()
    };
    let (has, wants) = (columns(has), columns(wants));
    (has != wants).then(|| {
        format!(
            "it has ({}), the statement declares ({}); leave the columns out to use the table as \
             it is",
            has.join(", "),
            wants.join(", ")
        )
    })
}

/// The longest connecting to the server and reading a table's columns may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The schema of the table (or view) `$2`: in schema `$1`, or the one the search path finds
/// when `$1` is NULL; no row where there is none.
const TABLE_SCHEMA: &str = "SELECT n.nspname::text
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname = $2 AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
      AND (($1::text IS NULL AND pg_catalog.pg_table_is_visible(c.oid)) OR n.nspname = $1)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_then_options_say_where_to_connect() {
        let options: BTreeMap<String, String> = [
            (
                "url".to_string(),
                "postgres://app:p%40ss@db.example:6543/shop?sslmode=disable".to_string(),
            ),
            ("port".to_string(), "7000".to_string()),
        ]
        .into();
        let settings = Settings::resolve(&options).unwrap();
        assert_eq!(settings.get("pass"), "p@ss");
        assert_eq!(settings.describe(), "app@db.example:7000/shop");
        assert_eq!(settings.get("sslmode"), "disable");
        let bad: BTreeMap<String, String> = [("hots".to_string(), "x".to_string())].into();
        let err = Settings::resolve(&bad).err().unwrap().to_string();
        assert!(err.contains("'hots'") && err.contains("'host'"), "{err}");
        for text in ["mysql://u:SECRET@h/db", "host=h password=SECRET user=u"] {
            let url: BTreeMap<String, String> = [("url".to_string(), text.to_string())].into();
            let err = Settings::resolve(&url).err().unwrap().to_string();
            assert!(!err.contains("SECRET"), "{err}");
        }
    }
}
