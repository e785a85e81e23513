//! Versions pinned and read once per query, messages cut for a person, and the files a
//! version may name.

use super::checked::is_own_file;
use super::*;

fn at(pairs: &[(&str, &str)]) -> Result<At> {
    let options = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    At::from_options("t", &options)
}

/// The table of `data/sample/customers_delta/` with its first commit only, in `dir`.
fn first_version_in(dir: &std::path::Path) {
    let source = std::path::Path::new("data/sample/customers_delta");
    std::fs::create_dir_all(dir.join("_delta_log")).unwrap();
    for entry in std::fs::read_dir(source).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    add_commit(dir, 0);
}

fn add_commit(dir: &std::path::Path, version: u64) {
    let name = format!("_delta_log/{version:020}.json");
    let source = std::path::Path::new("data/sample/customers_delta").join(&name);
    std::fs::copy(source, dir.join(name)).unwrap();
}

/// Every reference to a table in one query (one planning start) gets the one scan, even
/// where a commit came between them; the next query gets a scan of its own.
#[tokio::test]
async fn one_query_reads_one_version_however_often_it_names_the_table() {
    let dir = tempfile::tempdir().unwrap();
    first_version_in(dir.path());
    let url = folder_location(&format!("{}/", dir.path().display())).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
    let table = open(&url, store, &At::Newest).await.unwrap();
    let scan = checked_scan(&table, "t", "here", None).await.unwrap();
    let provider = DeltaTableProvider {
        name: "t".into(),
        location: "here".into(),
        log_store: table.log_store(),
        version: None,
        schema: scan.schema(),
        scanned: scan.schema(),
        warehouse: false,
        loaded: None,
        planned: Default::default(),
    };
    let began = Utc::now();
    let first = provider.scan_for(Some(began)).await.unwrap();
    add_commit(dir.path(), 1);
    let again = provider.scan_for(Some(began)).await.unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    let next = provider.scan_for(Some(Utc::now())).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &next));
}

#[test]
fn messages_lose_backtraces_and_debug_dumps() {
    let kernel = "Invalid JSON in commit 2: EOF\n   0: buoyant_kernel::error::Error::with_backtrace\n   1: x";
    assert_eq!(readable(kernel), "Invalid JSON in commit 2: EOF");
    let stack = "bad schema\n\nStack backtrace:\n   0: x";
    assert_eq!(readable(stack), "bad schema");
    assert_eq!(readable("one line"), "one line");
    assert!(readable("found gap: ParsedLogPath { username: \"k\" }").contains("has a gap"));
}

#[test]
fn data_files_are_the_tables_own() {
    for own in [
        "part-0.parquet",
        "city=lima/part-0.parquet",
        "a b/c:d.parquet",
    ] {
        assert!(is_own_file(own), "{own}");
    }
    for other in [
        "",
        "../x.parquet",
        "a/../../x.parquet",
        "./x.parquet",
        "/tmp/x.parquet",
        "a//x.parquet",
        "..\\x.parquet",
        "file:///tmp/x.parquet",
        "s3://bucket/x.parquet",
        "https://host/x.parquet",
        ".\t./x.parquet",
        " ../x.parquet",
        "\u{1f}../x.parquet",
        " /tmp/x.parquet",
        "c|/tmp/x.parquet",
        "..?x",
        "#/../x",
    ] {
        assert!(!is_own_file(other), "{other}");
    }
}

#[test]
fn options_pin_a_version_or_a_time_and_refuse_the_rest() {
    assert_eq!(at(&[]).unwrap(), At::Newest);
    assert_eq!(at(&[("version", "3")]).unwrap(), At::Version(3));
    assert!(matches!(
        at(&[("timestamp", "2026-12-01T10:00:00Z")]).unwrap(),
        At::Time(_)
    ));
    let refused = |pairs: &[(&str, &str)], says: &str| {
        let message = at(pairs).unwrap_err().to_string();
        assert!(message.contains(says), "{message}");
    };
    refused(&[("version", "-1")], "expected a version number");
    refused(&[("version", "three")], "expected a version number");
    refused(&[("timestamp", "yesterday")], "RFC 3339");
    refused(
        &[("version", "1"), ("timestamp", "2026-12-01T10:00:00Z")],
        "not both",
    );
    refused(&[("path", "x")], "not 'path'");
}
