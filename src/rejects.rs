//! Rows a model fails on: kept (`SET batchinfer.on_error = 'reject'`), counted and bounded
//! (`SET batchinfer.max_errors`).
//!
//! A rejected row gets NULL, as with `on_error = 'null'`, and is written to the rejects location
//! (`batchinfer.rejects`; by default the warehouse's `rejects/`) as Parquet, in one folder per
//! statement (`rejects/STATEMENT/`): the statement's id and text, the time, the model's name and
//! sha256, the model's message, and the row's input values as the model received them (the
//! argument columns, with their names and types), so that `predict` over that folder retries
//! them. The files are written while the statement runs, by the process that scores the rows
//! (the executors of a cluster too), each whole (a rename locally, one PUT in S3): a statement
//! stopped by its budget keeps the rejects it found.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit};
use datafusion::parquet::arrow::ArrowWriter;

use crate::config::{BatchInferOptions, OnError};
pub use crate::config::{ErrorBudget, SHARE_AFTER};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::statement_context::StatementContext;
use crate::storage::StoreRegistry;
use crate::warehouse::Warehouse;

/// What one statement's model calls in this process have scored and failed on so far (kept in
/// the statement's own ledger).
#[derive(Debug, Default)]
struct Tally {
    scored: u64,
    failed: u64,
    first: Vec<String>,
}

/// The rows each model of one statement gave NULL (its failures under `on_error = 'null'` or
/// `'reject'`), by model name (kept in the statement's own ledger: another statement's rows,
/// of this session or another, are never counted here).
#[derive(Debug, Default)]
struct Nulled(parking_lot::Mutex<std::collections::BTreeMap<String, u64>>);

/// The rows each model gave NULL for `statement` since the last call, by model; resets them.
pub fn take_nulled(statement: &StatementContext) -> Vec<(String, u64)> {
    std::mem::take(&mut *statement.ledger.get::<Nulled>().0.lock())
        .into_iter()
        .collect()
}

/// Counts a batch's rows for the statement at hand (its rows given NULL, by model), and stops
/// it once its failed rows are past `batchinfer.max_errors`: the error gives the count and the
/// first messages.
pub fn count(
    options: &BatchInferOptions,
    statement: &StatementContext,
    model: &str,
    scored: usize,
    failed: &[(usize, String)],
) -> Result<()> {
    if !failed.is_empty() {
        *statement
            .ledger
            .get::<Nulled>()
            .0
            .lock()
            .entry(model.to_string())
            .or_default() += failed.len() as u64;
    }
    let Some(budget) = options.max_errors else {
        return Ok(());
    };
    let tally = statement.ledger.get::<parking_lot::Mutex<Tally>>();
    let mut tally = tally.lock();
    tally.scored += scored as u64;
    tally.failed += failed.len() as u64;
    for (_, message) in failed {
        let message = format!("model '{model}': {message}");
        if tally.first.len() < 3 && !tally.first.contains(&message) {
            tally.first.push(message);
        }
    }
    let over = budget
        .exceeded(tally.scored, tally.failed)
        .then(|| Error::ErrorBudget {
            failed: tally.failed,
            budget: budget.to_string(),
            problem: format!(
                "{} rows failed of {} scored, past batchinfer.max_errors = '{budget}'; nothing is \
             written; the first failures: {}",
                tally.failed,
                tally.scored,
                tally.first.join("; ")
            ),
        });
    over.map_or(Ok(()), Err)
}

/// The columns every rejects file starts with; the row's inputs follow.
pub fn meta_fields() -> Vec<Field> {
    vec![
        Field::new("statement_id", DataType::Utf8, false),
        Field::new("statement", DataType::Utf8, false),
        Field::new(
            "rejected_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("model", DataType::Utf8, false),
        Field::new("model_sha256", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
    ]
}

/// The schema of `batchinfer_rejects()`: what every rejects file has.
pub fn meta_schema() -> SchemaRef {
    Arc::new(Schema::new(meta_fields()))
}

/// Per process: a counter for unique names.
static FILES: AtomicU64 = AtomicU64::new(0);

/// Writes the rows of `columns` (the model's arguments, described by `fields`) that `model`
/// failed on to the statement's rejects folder, with the model's messages.
/// The model whose failed rows are kept: its name and sha256 (a model file's, or an endpoint
/// model's definition's).
#[derive(Debug, Clone, Copy)]
pub struct Rejecting<'a> {
    pub name: &'a str,
    pub sha256: &'a str,
}

impl<'a> From<&'a Model> for Rejecting<'a> {
    fn from(model: &'a Model) -> Self {
        Rejecting {
            name: &model.name,
            sha256: &model.sha256,
        }
    }
}

pub fn keep(
    stores: &StoreRegistry,
    statement: &StatementContext,
    model: Rejecting<'_>,
    fields: &[FieldRef],
    columns: &[ArrayRef],
    failed: &[(usize, String)],
) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let rows = failed.len();
    let positions: datafusion::arrow::array::UInt32Array = failed
        .iter()
        .map(|(row, _)| u32::try_from(*row).ok())
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let repeat = |text: &str| Arc::new(StringArray::from(vec![text; rows])) as ArrayRef;
    let mut meta = meta_fields();
    let mut arrays: Vec<ArrayRef> = vec![
        repeat(&statement.id),
        repeat(&statement.text),
        Arc::new(TimestampMicrosecondArray::from(vec![now; rows]).with_timezone("UTC")),
        repeat(model.name),
        repeat(model.sha256),
        Arc::new(StringArray::from_iter_values(
            failed.iter().map(|(_, m)| m.as_str()),
        )),
    ];
    for (field, column) in fields.iter().zip(columns) {
        let mut name = field.name().clone();
        while meta.iter().any(|f| f.name() == &name) {
            name.push_str("_input");
        }
        meta.push(Field::new(name, column.data_type().clone(), true));
        arrays.push(take(column.as_ref(), &positions, None)?);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(meta)), arrays)?;
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), None)?;
    writer
        .write(&batch)
        .and_then(|()| writer.close().map(drop))?;
    let folder = statement_folder(statement)?;
    // A model's name is a name (CREATE MODEL, --models and the warehouse check it); one that
    // came otherwise (a cluster client's definitions) is not put in a path.
    let name = match crate::storage::check_name("model", model.name) {
        Ok(()) => model.name,
        Err(_) => "model",
    };
    let file = folder
        .join(&format!(
            "{}-{}-{}.parquet",
            name,
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ))
        .map_err(|e| Error::setting("batchinfer.rejects", format!("{folder}: {e}")))?;
    stores.write_file(&file, bytes)
}

/// Where the rejects of a statement run with `options` go, as a folder: `batchinfer.rejects`,
/// else the warehouse's `rejects/` (else `rejects/`). Where rows are rejected (`on_error =
/// 'reject'`), a place of its own that batchinfer can write to.
pub fn location(
    options: &BatchInferOptions,
    warehouse: Option<&Warehouse>,
    stores: &StoreRegistry,
) -> Result<url::Url> {
    let rejects = match (&*options.rejects, warehouse) {
        ("", Some(warehouse)) => warehouse.rejects_location()?,
        ("", None) => "rejects/".to_string(),
        (set, _) => set.to_string(),
    };
    let unusable = |e: Error| {
        Error::setting(
            "batchinfer.rejects",
            format!("batchinfer.rejects '{rejects}' cannot be used: {e}"),
        )
    };
    let url = crate::storage::folder_location(&rejects).map_err(unusable)?;
    if options.on_error == OnError::Reject {
        // A place of its own: not a folder of the warehouse's (a DROP would delete the
        // rejects, or a listing would take them for a table), not one a `..` names, and
        // one batchinfer can write to.
        if let Some(folder) = warehouse.and_then(|w| w.own_folder_holding(&url)) {
            return Err(unusable(Error::setting(
                "batchinfer.rejects",
                format!(
                    "it is in the warehouse's {folder}/ folder, which holds the warehouse's own \
                 files; leave batchinfer.rejects unset for the warehouse's rejects/"
                ),
            )));
        }
        if rejects.split(['/', '\\']).any(|part| part == "..") {
            return Err(unusable(Error::setting(
                "batchinfer.rejects",
                "it names a folder through '..': name the folder itself",
            )));
        }
        let store = stores.commit_store(&url).map_err(unusable)?;
        if store.read_only().is_some() {
            return Err(unusable(Error::setting(
                "batchinfer.rejects",
                "it is on a server batchinfer reads from only",
            )));
        }
        // Its statement folders are read back as tables: named plainly, and a folder.
        crate::storage::check_write_target(&rejects).map_err(unusable)?;
        crate::storage::object_path(&url).map_err(unusable)?;
        stores.check_folder(&url).map_err(unusable)?;
    }
    Ok(url)
}

/// The folder of the statement at hand's rejects: `REJECTS/STATEMENT/`.
pub fn statement_folder(statement: &StatementContext) -> Result<url::Url> {
    let root = match statement.rejects.as_str() {
        "" => "rejects/",
        set => set,
    };
    let root = crate::storage::folder_location(root)?;
    let id = if statement.id.is_empty() {
        "statement"
    } else {
        statement.id.as_str()
    };
    // A name, never a path: the id comes with the query (a cluster's executors read the
    // client's), and no id may reach outside the rejects folder.
    crate::storage::check_name("statement id", id)?;
    root.join(&format!("{id}/"))
        .map_err(|e| Error::setting("batchinfer.rejects", format!("{root}{id}/: {e}")))
}

/// A new statement id: when it began (UTC, sortable), this process and a counter.
pub fn statement_id() -> String {
    // Per process: a counter for unique names.
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}-{}",
        chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now())
            .format("%Y%m%d-%H%M%S-%3f"),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The rows `statement` rejected, per model, and the folder they are in (nothing unless it
/// keeps rejects, `on_error = 'reject'`): counted from the files, wherever they were written.
pub async fn rejected(
    stores: &StoreRegistry,
    statement: &StatementContext,
) -> Result<(Vec<(String, u64)>, String)> {
    if !statement.keeps_rejects {
        return Ok((Vec::new(), String::new()));
    }
    let folder = statement_folder(statement)?;
    let counts = stores.count_rejects(&folder).await?;
    Ok((counts, crate::storage::display_location(&folder)))
}

/// Before `statement`'s writes commit: its rejects, counted wherever they were written (the
/// executors of a cluster each count only their own while it runs), are within `budget`
/// (`batchinfer.max_errors`); a share is held at every size here, however few rows were scored
/// (while the statement runs it is checked only past [`SHARE_AFTER`] rows, when it means
/// something).
pub async fn check_budget(
    stores: &StoreRegistry,
    statement: &StatementContext,
    budget: Option<ErrorBudget>,
) -> Result<()> {
    match budget {
        Some(ErrorBudget::Count(most)) => {
            let (counts, folder) = rejected(stores, statement).await?;
            let rejected: u64 = counts.iter().map(|(_, rows)| rows).sum();
            if rejected > most {
                return Err(Error::ErrorBudget {
                    failed: rejected,
                    budget: most.to_string(),
                    problem: format!(
                        "{rejected} rows failed, past batchinfer.max_errors = '{most}'; nothing \
                         is written; they are in {folder}"
                    ),
                });
            }
            Ok(())
        }
        Some(budget @ ErrorBudget::Share(share)) => {
            let tally = statement.ledger.get::<parking_lot::Mutex<Tally>>();
            let tally = tally.lock();
            if tally.failed as f64 > share * tally.scored as f64 {
                return Err(Error::ErrorBudget {
                    failed: tally.failed,
                    budget: budget.to_string(),
                    problem: format!(
                        "{} rows failed of {} scored, past batchinfer.max_errors = '{budget}'; \
                         nothing is written; the first failures: {}",
                        tally.failed,
                        tally.scored,
                        tally.first.join("; ")
                    ),
                });
            }
            Ok(())
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_and_bound() {
        assert_eq!("100".parse(), Ok(ErrorBudget::Count(100)));
        assert_eq!(" 0.5% ".parse(), Ok(ErrorBudget::Share(0.005)));
        assert!("-1".parse::<ErrorBudget>().is_err());
        assert!("101%".parse::<ErrorBudget>().is_err());
        assert!("lots".parse::<ErrorBudget>().is_err());
        assert!(!ErrorBudget::Count(2).exceeded(10, 2));
        assert!(ErrorBudget::Count(2).exceeded(10, 3));
        // A share is checked once SHARE_AFTER rows were scored.
        assert!(!ErrorBudget::Share(0.01).exceeded(999, 500));
        assert!(ErrorBudget::Share(0.01).exceeded(1_000, 11));
        assert!(!ErrorBudget::Share(0.01).exceeded(1_000, 10));
    }

    #[test]
    fn statement_ids_begin_with_the_time_in_utc() {
        let id = statement_id();
        let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now());
        assert!(id.starts_with(&now.format("%Y%m%d-").to_string()), "{id}");
        assert_ne!(statement_id(), statement_id());
    }

    #[test]
    fn a_statement_id_never_reaches_outside_the_rejects_folder() {
        let dir = tempfile::tempdir().unwrap();
        let rejects = format!("{}/rejects/", dir.path().display());
        for id in ["../../escaped", "a/b", "..", "%2e%2e", "/tmp/x", "a?b"] {
            let options = StatementContext {
                rejects: rejects.clone(),
                id: id.to_string(),
                ..Default::default()
            };
            assert!(statement_folder(&options).is_err(), "{id}");
        }
        let options = StatementContext {
            rejects,
            id: statement_id(),
            ..Default::default()
        };
        let folder = statement_folder(&options).unwrap();
        assert!(
            folder
                .path()
                .starts_with(&format!("{}/rejects/", dir.path().display()))
        );
    }
}
