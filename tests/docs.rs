//! Every ```sql example of the README and of docs/ runs as written, against the sample data
//! (`data/`), the models of `data/models`, the MiniLM folders `scripts/fetch_minilm.sh`
//! fetches, the photos and image model of `scripts/image_models.sh`, the manuals of
//! `scripts/documents.sh` and the videos of `scripts/video.sh`, in a fresh working folder and warehouse per page, a page's examples
//! one after the other. An example that names a server (S3, Azure, Google Cloud Storage,
//! PostgreSQL) runs in the suite that starts that server (tests/s3.rs, tests/cloud_stores.rs,
//! tests/databases.rs); here it is only counted.

mod common;
mod fixtures;

use std::path::{Path, PathBuf};

use common::{bin, output_within, sql_blocks};

/// The server an example needs, if any.
fn server_of(sql: &str) -> Option<&'static str> {
    let upper = sql.to_ascii_uppercase();
    [
        ("S3://", "S3"),
        ("AZ://", "Azure"),
        ("GS://", "Google Cloud Storage"),
        ("STORED AS POSTGRES", "PostgreSQL"),
        ("'ENDPOINT'", "an LLM server"),
        ("GENERATE(", "an LLM server"),
        ("LLM CACHE", "an LLM server"),
    ]
    .into_iter()
    .find(|(mark, _)| upper.contains(mark))
    .map(|(_, server)| server)
}

/// The documents whose examples run: the README and every page of docs/.
fn documents() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir("docs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.insert(0, PathBuf::from("README.md"));
    pages
}

/// A working folder as the documents assume one: `data/` with the sample tables and models (and
/// the SQLite file docs/databases.md reads), and `models/` with the fetched MiniLM folders.
fn working_folder(root: &Path) {
    let here = std::env::current_dir().unwrap();
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for part in ["sample", "models", "reference"] {
        std::os::unix::fs::symlink(here.join("data").join(part), data.join(part)).unwrap();
    }
    let db = make_events_db(&data.join("events.db"));
    assert!(db, "the SQLite file for docs/databases.md is made");
    let models = root.join("models");
    std::fs::create_dir_all(&models).unwrap();
    for name in ["all-MiniLM-L6-v2", "paraphrase-MiniLM-L3-v2"] {
        std::os::unix::fs::symlink(fixtures::fetch_model(name), models.join(name)).unwrap();
    }
    // docs/files.md's photos and image model (scripts/image_models.sh).
    let images = fixtures::image_assets();
    std::os::unix::fs::symlink(images.join("photos"), root.join("photos")).unwrap();
    std::os::unix::fs::symlink(images.join("nsfw"), models.join("nsfw")).unwrap();
    std::os::unix::fs::symlink(images.join("magika"), models.join("magika")).unwrap();
    // docs/documents.md's manuals (scripts/documents.sh).
    let documents = fixtures::made_by("documents.sh", &[]);
    std::os::unix::fs::symlink(documents.join("pdf"), root.join("manuals")).unwrap();
    // docs/video.md's videos (scripts/video.sh).
    let videos = fixtures::made_by("video.sh", &[]);
    std::os::unix::fs::symlink(videos.join("real"), root.join("videos")).unwrap();
}

/// Writes a SQLite file with a table `events` (made by Python's sqlite3, a reference apart
/// from batchinfer); whether it was made.
fn make_events_db(path: &Path) -> bool {
    let script = format!(
        "import sqlite3; c = sqlite3.connect({path:?}); \
         c.execute('CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT)'); \
         c.executemany('INSERT INTO events (kind) VALUES (?)', [('open',), ('click',), ('close',)]); \
         c.commit()",
        path = path.display().to_string()
    );
    std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn every_sql_example_in_the_documents_runs() {
    let mut ran = 0;
    let mut elsewhere = Vec::new();
    let mut failures = Vec::new();
    for page in documents() {
        let text = std::fs::read_to_string(&page).unwrap();
        let blocks = sql_blocks(&text);
        if blocks.is_empty() {
            continue;
        }
        let work = tempfile::tempdir().unwrap();
        working_folder(work.path());
        for (i, sql) in blocks.iter().enumerate() {
            if let Some(server) = server_of(sql) {
                elsewhere.push(format!("{} #{} ({server})", page.display(), i + 1));
                continue;
            }
            let file = work.path().join(format!("example-{i}.sql"));
            std::fs::write(&file, sql).unwrap();
            let mut command = bin();
            command
                .current_dir(work.path())
                .arg("--warehouse")
                .arg(work.path().join("warehouse"));
            // A page that creates its models runs without --models (a model of --models cannot
            // be created again); the others score with the sample's models.
            if !sql.to_ascii_uppercase().contains("CREATE MODEL") {
                command.args(["--models", "data/models"]);
            }
            let out = output_within(command.args(["query", "-f"]).arg(&file), common::DEADLINE);
            ran += 1;
            if !out.status.success() {
                failures.push(format!(
                    "{} example {}:\n{sql}\n{}",
                    page.display(),
                    i + 1,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 10, "{ran} examples ran");
    eprintln!("{ran} examples ran; run with their servers: {elsewhere:?}");
}

#[test]
fn examples_are_found_where_they_are_indented_too() {
    let text = "intro\n```sql\nSELECT 1;\n```\n- a list:\n  ```sql\n  SELECT 2;\n  ```\n```text\nno\n```\n";
    assert_eq!(sql_blocks(text), vec!["SELECT 1;\n", "SELECT 2;\n"]);
    assert_eq!(server_of("COPY t TO 's3://b/x'"), Some("S3"));
    assert_eq!(server_of("SELECT 1"), None);
}
