//! One suite for every store: the same scenarios, through the real binary, against a local
//! folder, S3 (the tests' s3s server), Azure Blob Storage (Azurite) and Google Cloud Storage
//! (fake-gcs-server). Google Cloud Storage is read only here: fake-gcs-server does not
//! implement the XML API object_store writes with, so writes to it stay untested.
//!
//! What is particular to one store (its URL forms, its credentials, an upload cut off half-way)
//! is tested in that store's own file (`s3.rs`, `cloud_stores.rs`).

mod common;
mod emulators;
mod fixtures;
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{assert_failure, assert_ok};
use emulators::{Azurite, FakeGcs};
use s3_server::S3Server;

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

/// The stores every scenario runs against.
const KINDS: [Kind; 4] = [Kind::Local, Kind::S3, Kind::Azure, Kind::Gcs];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Local,
    S3,
    Azure,
    Gcs,
}

enum Server {
    Local(PathBuf),
    S3(S3Server),
    Azure(Azurite),
    Gcs(FakeGcs),
}

/// A store holding the sample features as four files in `data/features/`, the linear model as
/// `models/linear.onnx` and `models/scorer/model.onnx`, and (where it is written) empty
/// buckets `out` and `lake`.
struct Store {
    kind: Kind,
    server: Server,
    dir: tempfile::TempDir,
}

impl Store {
    fn start(kind: Kind) -> Store {
        let dir = tempfile::tempdir().unwrap();
        let mut seed: Vec<(&str, String, &str)> = (0..4)
            .map(|part| {
                let key = format!("features/part-{part}.parquet");
                ("data", key, "data/sample/features.parquet")
            })
            .collect();
        seed.push(("models", "linear.onnx".into(), "data/models/linear.onnx"));
        seed.push((
            "models",
            "scorer/model.onnx".into(),
            "data/models/linear.onnx",
        ));
        let server = match kind {
            Kind::Local | Kind::Gcs => {
                let root = dir.path().join("store");
                for (bucket, key, file) in &seed {
                    let path = root.join(bucket).join(key);
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::copy(file, path).unwrap();
                }
                match kind {
                    Kind::Local => {
                        for bucket in ["out", "lake"] {
                            std::fs::create_dir_all(root.join(bucket)).unwrap();
                        }
                        Server::Local(root)
                    }
                    _ => Server::Gcs(FakeGcs::start(&dir.path().join("gcs"), &root)),
                }
            }
            Kind::S3 => {
                let server = S3Server::start(&dir.path().join("s3"));
                for (bucket, key, file) in &seed {
                    server.put_file(bucket, key, Path::new(file));
                }
                server.bucket("out");
                server.bucket("lake");
                Server::S3(server)
            }
            Kind::Azure => {
                let server = Azurite::start(&dir.path().join("azurite"));
                for container in ["data", "models", "out", "lake"] {
                    server.create_container(container);
                }
                for (container, blob, file) in &seed {
                    server.put_file(container, blob, Path::new(file));
                }
                Server::Azure(server)
            }
        };
        Store { kind, server, dir }
    }

    /// Whether batchinfer writes to this store here.
    fn written(&self) -> bool {
        self.kind != Kind::Gcs
    }

    /// The URL (or, locally, the path) of `key` in `bucket`.
    fn url(&self, bucket: &str, key: &str) -> String {
        match &self.server {
            Server::Local(root) => format!("{}/{key}", root.join(bucket).display()),
            Server::S3(_) => format!("s3://{bucket}/{key}"),
            Server::Azure(_) => format!("az://{bucket}/{key}"),
            Server::Gcs(_) => format!("gs://{bucket}/{key}"),
        }
    }

    /// The keys under `prefix` of `bucket`, as the store lists them (not through batchinfer).
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let mut keys = match &self.server {
            Server::Local(root) => {
                let mut keys = Vec::new();
                let mut folders = vec![root.join(bucket)];
                while let Some(folder) = folders.pop() {
                    for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                        let path = entry.path();
                        if path.is_dir() {
                            folders.push(path);
                        } else {
                            let key = path.strip_prefix(root.join(bucket)).unwrap();
                            keys.push(key.to_string_lossy().into_owned());
                        }
                    }
                }
                keys
            }
            Server::S3(server) => server.keys(bucket, ""),
            Server::Azure(server) => server.blobs(bucket, false),
            Server::Gcs(server) => server.objects(bucket),
        };
        keys.retain(|key| key.starts_with(prefix));
        keys.sort();
        keys
    }

    /// The binary pointed at this store, with no cloud settings from the test's environment.
    fn command(&self) -> Command {
        let mut command = common::bin();
        for (key, _) in std::env::vars() {
            if key.starts_with("AZURE") || key.starts_with("GOOGLE") || key.starts_with("AWS") {
                command.env_remove(key);
            }
        }
        command.env("BATCHINFER_WAREHOUSE", self.dir.path().join("wh"));
        match &self.server {
            Server::Local(_) => {}
            Server::S3(server) => {
                server.client(&mut command);
            }
            Server::Azure(server) => {
                command.envs(server.env());
            }
            Server::Gcs(server) => {
                command
                    .env("GOOGLE_SERVICE_ACCOUNT_KEY", server.service_account_key())
                    .env("GOOGLE_ALLOW_HTTP", "true");
            }
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        common::output_within(self.command().args(args), common::DEADLINE)
    }
}

fn sorted(mut rows: Vec<(i64, Vec<f64>)>) -> Vec<(i64, Vec<f64>)> {
    rows.sort_by_key(|r| r.0);
    rows
}

#[test]
fn every_store_is_scored_with_its_own_models_and_the_results_written_back() {
    let want = common::local_scores(4);
    for kind in KINDS {
        let store = Store::start(kind);
        let (features, model) = (
            store.url("data", "features/"),
            store.url("models", "linear.onnx"),
        );
        let select = format!("SELECT id, predict('lin', {FEATURES}) AS p FROM '{features}'");
        let create = format!("CREATE MODEL lin FROM '{model}'");
        let out = store.run(&[
            "--partitions",
            "4",
            "query",
            "-e",
            &format!("{create}; {select}"),
        ]);
        common::assert_same_rows(&sorted(common::rows(&assert_ok(&out))), &want, 1e-6);
        // A folder of models in the store, with --models: its files and its model folders.
        let models = store.url("models", "");
        let part = store.url("data", "features/part-1.parquet");
        let out = store.run(&[
            "--models",
            &models,
            "query",
            "-e",
            &format!(
                "SELECT count(predict('linear', {FEATURES})) AS n, \
                 count(predict('scorer', {FEATURES})) AS m FROM '{part}'"
            ),
        ]);
        assert_eq!(assert_ok(&out), "n,m\n10000,10000\n", "{kind:?}");
        if !store.written() {
            continue;
        }
        let scores = store.url("out", "scores/");
        let copy = format!("COPY ({select}) TO '{scores}' STORED AS PARQUET");
        let out = store.run(&["--partitions", "4", "query", "-e", &copy]);
        assert_ok(&out);
        let files = store.keys("out", "scores/");
        assert!(
            files.len() >= 2 && files.iter().all(|k| k.ends_with(".parquet")),
            "{kind:?}: several Parquet files: {files:?}"
        );
        let out = store.run(&["query", "-e", &format!("SELECT id, p FROM '{scores}'")]);
        common::assert_same_rows(&sorted(common::rows(&assert_ok(&out))), &want, 1e-6);
    }
}

#[test]
fn a_warehouse_in_every_written_store_keeps_models_and_tables_across_processes() {
    let want = common::local_scores(4);
    for kind in KINDS {
        let store = Store::start(kind);
        if !store.written() {
            continue;
        }
        let warehouse = store.url("lake", "wh/");
        let in_wh = |sql: &str| store.run(&["--warehouse", &warehouse, "query", "-e", sql]);
        let (features, scorer) = (
            store.url("data", "features/"),
            store.url("models", "scorer/"),
        );
        assert_ok(&in_wh(&format!(
            "CREATE MODEL lin FROM '{scorer}';
             CREATE TABLE scored AS SELECT id, predict('lin', {FEATURES}) AS p FROM '{features}'"
        )));
        assert!(
            store
                .keys("lake", "wh/models/")
                .contains(&"wh/models/lin/manifest-00000000000000000001.json".to_string())
                && store
                    .keys("lake", "wh/model-files/")
                    .iter()
                    .any(|k| k.ends_with("/model.onnx")),
            "{kind:?}: {:?}",
            store.keys("lake", "")
        );
        assert!(
            !store.keys("lake", "wh/tables/scored/").is_empty(),
            "{kind:?}"
        );

        // Other processes find the table and the model definition.
        let out = in_wh("SELECT id, p FROM scored");
        common::assert_same_rows(&sorted(common::rows(&assert_ok(&out))), &want, 1e-6);
        let part = store.url("data", "features/part-1.parquet");
        let out = in_wh(&format!(
            "SELECT count(*) AS n FROM '{part}' WHERE predict('lin', {FEATURES}) IS NOT NULL"
        ));
        assert_eq!(
            assert_ok(&out),
            "n\n10000\n",
            "{kind:?}: the model persisted"
        );

        // A CREATE of a name taken is refused and leaves the table; a replace has the new
        // rows only; DROP removes the files.
        assert_failure(
            &in_wh("CREATE TABLE scored AS SELECT 1 AS one"),
            &["table 'scored' already exists"],
        );
        assert_eq!(
            assert_ok(&in_wh("SELECT count(*) AS n FROM scored")),
            "n\n40000\n"
        );
        assert_ok(&in_wh(
            "CREATE OR REPLACE TABLE scored AS SELECT id, p FROM scored WHERE id < 100",
        ));
        assert_eq!(
            assert_ok(&in_wh("SELECT count(*) AS n FROM scored")),
            "n\n400\n",
            "{kind:?}: the replaced table has only the new rows"
        );
        assert_ok(&in_wh("DROP TABLE scored"));
        assert_eq!(
            store.keys("lake", "wh/tables/scored/"),
            Vec::<String>::new()
        );
        assert!(
            !assert_ok(&in_wh("SHOW TABLES")).contains("scored"),
            "{kind:?}"
        );
    }
}

#[test]
fn what_is_missing_in_any_store_is_one_error_naming_it() {
    for kind in KINDS {
        let store = Store::start(kind);
        let missing = store.url("data", "nothing-here.parquet");
        let out = store.run(&["query", "-e", &format!("SELECT * FROM '{missing}'")]);
        let said = assert_failure(&out, &[&missing]);
        assert_eq!(said.matches("Error:").count(), 1, "{kind:?}: {said}");
        let model = store.url("models", "missing.onnx");
        let out = store.run(&["query", "-e", &format!("CREATE MODEL m FROM '{model}'")]);
        assert_failure(&out, &["model 'm'", &model, "does not exist"]);
    }
}
