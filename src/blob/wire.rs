//! `read_blob`'s table and exec as a cluster sends them: the scheduler plans over the table, the
//! executors read the files the exec lists.

use super::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Table {
    url: String,
    glob: Option<String>,
    location: String,
    form: Form,
    only: Option<Vec<(String, String)>>,
    #[serde(default)]
    ends: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct File {
    location: String,
    size: u64,
    last_modified_us: i64,
    e_tag: Option<String>,
    version: Option<String>,
    name: String,
}

#[derive(Serialize, Deserialize)]
struct Exec {
    store: String,
    form: Form,
    #[serde(default)]
    files_errors_fail: bool,
    max_bytes: u64,
    batch_rows: usize,
    #[serde(default)]
    ends: Option<u64>,
    columns: Vec<usize>,
    partitions: usize,
    files: Vec<File>,
}

fn malformed(e: impl fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("a read_blob sent by the cluster is malformed: {e}"))
}

/// `provider` as bytes, where it is a `read_blob`'s table.
pub fn encode_table(provider: &dyn TableProvider) -> Option<Vec<u8>> {
    let table = provider.downcast_ref::<BlobTable>()?;
    serde_json::to_vec(&Table {
        url: table.url.get_url().to_string(),
        glob: table
            .url
            .get_glob()
            .as_ref()
            .map(|g| g.as_str().to_string()),
        location: table.location.clone(),
        form: table.form,
        only: table.only.as_ref().map(|o| o.as_ref().clone()),
        ends: table.ends,
    })
    .ok()
}

pub fn decode_table(buf: &[u8]) -> datafusion::error::Result<Arc<dyn TableProvider>> {
    let table: Table = serde_json::from_slice(buf).map_err(malformed)?;
    let url = url::Url::parse(&table.url).map_err(malformed)?;
    let mut listing = ListingTableUrl::try_new(url, None)?;
    if let Some(glob) = &table.glob {
        listing = listing.with_glob(glob)?;
    }
    Ok(Arc::new(BlobTable {
        url: listing,
        location: table.location,
        form: table.form,
        schema: schema(table.form),
        only: table.only.map(Arc::new),
        ends: table.ends.filter(|_| table.form == Form::Blob),
    }))
}

/// `plan` as bytes, where it is a `read_blob`'s exec.
pub fn encode_exec(plan: &dyn ExecutionPlan) -> Option<Vec<u8>> {
    let exec = plan.downcast_ref::<BlobExec>()?;
    let files = &exec.files;
    serde_json::to_vec(&Exec {
        store: files.store_url.clone(),
        form: files.form,
        files_errors_fail: files.files_errors_fail,
        max_bytes: files.max_bytes,
        batch_rows: files.batch_rows,
        ends: files.ends,
        columns: exec.columns.clone(),
        partitions: exec.partitions,
        files: files
            .metas
            .iter()
            .zip(&files.names)
            .map(|(meta, name)| File {
                location: meta.location.to_string(),
                size: meta.size,
                last_modified_us: meta.last_modified.timestamp_micros(),
                e_tag: meta.e_tag.clone(),
                version: meta.version.clone(),
                name: name.clone(),
            })
            .collect(),
    })
    .ok()
}

pub fn decode_exec(
    buf: &[u8],
    ctx: &TaskContext,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    let exec: Exec = serde_json::from_slice(buf).map_err(malformed)?;
    let store_url = datafusion::execution::object_store::ObjectStoreUrl::parse(&exec.store)?;
    let store = ctx.runtime_env().object_store(&store_url)?;
    let mut metas = Vec::with_capacity(exec.files.len());
    let mut names = Vec::with_capacity(exec.files.len());
    for file in exec.files {
        metas.push(ObjectMeta {
            location: object_store::path::Path::parse(&file.location).map_err(malformed)?,
            last_modified: chrono::DateTime::from_timestamp_micros(file.last_modified_us)
                .ok_or_else(|| malformed("a file's time"))?,
            size: file.size,
            e_tag: file.e_tag,
            version: file.version,
        });
        names.push(file.name);
    }
    let full = schema(exec.form);
    if exec.columns.iter().any(|c| *c >= full.fields().len()) || exec.partitions == 0 {
        return Err(malformed("its columns or partitions"));
    }
    let projected = Arc::new(full.project(&exec.columns)?);
    Ok(Arc::new(BlobExec::new(
        Files {
            store,
            store_url: exec.store,
            metas,
            names,
            form: exec.form,
            max_bytes: exec.max_bytes,
            batch_rows: exec.batch_rows.max(1),
            ends: exec.ends.filter(|b| *b > 0 && exec.form == Form::Blob),
            files_errors_fail: exec.files_errors_fail,
        },
        exec.columns,
        projected,
        exec.partitions,
    )))
}
