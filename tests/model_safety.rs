//! Data safety of models, through the real binary: a model's external data stays with it, a
//! model is used as the warehouse defines it at each statement (never a stale one), a model of
//! `--models` is its file, and a definition that cannot be read takes nothing else with it.

mod common;
mod fixtures;
mod s3_server;

use std::path::Path;

use common::{assert_failure, assert_ok, bin, piped, query, stdout, wait_with_deadline};

const PREDICT_M: &str = "predict('m', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)";

#[test]
fn a_models_external_data_stays_with_the_model() {
    // The working directory holds a weights.bin of its own: the model's is in its folder.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("weights.bin"), vec![0x3f; 44]).unwrap();
    let root = std::fs::canonicalize(".").unwrap();
    let external = root.join("data/fixtures/external");
    let sql = format!(
        "CREATE MODEL e FROM '{}/';
         SELECT count(*) AS n, sum(CASE WHEN abs(predict('e', v.features) - r.score) <= 1e-6 * greatest(abs(r.score), 1) THEN 1 ELSE 0 END) AS same
         FROM '{}' v JOIN '{}' r ON v.id = r.id",
        external.display(),
        root.join("data/sample/vectors.parquet").display(),
        external.join("reference.parquet").display()
    );
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh", "query", "-e", &sql])
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n,same\n100,100\n");
    // Protobuf fields batchinfer's reader might pass over (a group, which parsers accept and
    // skip) change nothing: the data still comes from the model's folder.
    let grouped = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(external.join("model.onnx")).unwrap();
    bytes.extend_from_slice(&[0x9b, 0x06, 0x08, 0x01, 0x9c, 0x06]);
    std::fs::write(grouped.path().join("model.onnx"), bytes).unwrap();
    std::fs::copy(
        external.join("weights.bin"),
        grouped.path().join("weights.bin"),
    )
    .unwrap();
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh1", "query", "-e"])
        .arg(sql.replacen(
            &format!("{}/", external.display()),
            &format!("{}/", grouped.path().display()),
            1,
        ))
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n,same\n100,100\n");
    // The data counts in the model's sha256: other weights, another hash.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(external.join("model.onnx"), copy.path().join("model.onnx")).unwrap();
    std::fs::write(copy.path().join("weights.bin"), vec![0x3f; 44]).unwrap();
    let hashes = format!(
        "CREATE MODEL a FROM '{}/'; CREATE MODEL b FROM '{}/';
         SELECT count(DISTINCT sha256) AS n FROM models() WHERE name IN ('a', 'b')",
        external.display(),
        copy.path().display()
    );
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh2", "query", "-e", &hashes])
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n\n2\n");
    // A model whose data file is named outside its folder is refused.
    let bytes = std::fs::read(external.join("model.onnx")).unwrap();
    let mut bytes = bytes.clone();
    let at = bytes.windows(11).position(|w| w == b"weights.bin").unwrap();
    bytes[at..at + 11].copy_from_slice(b"../ghts.bin");
    std::fs::write(copy.path().join("model.onnx"), &bytes).unwrap();
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh3", "query", "-e"])
        .arg(format!("CREATE MODEL x FROM '{}/'", copy.path().display()))
        .output()
        .unwrap();
    assert_failure(
        &out,
        &["../ghts.bin", "not a plain path inside the model's folder"],
    );
}

#[test]
fn a_model_dropped_from_an_s3_warehouse_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = server.lake_warehouse();
    let create = "CREATE MODEL m FROM 'data/models/linear.onnx';
                  CREATE MODEL m2 FROM 'data/models/linear.onnx'";
    assert_ok(&run(create).output().unwrap());
    assert_ok(&run("DROP MODEL m").output().unwrap());
    // A new process reads the warehouse afresh: m is gone, m2 (a longer name) is not.
    let out = run("SELECT name FROM models() ORDER BY name")
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "name\nm2\n");
    assert_eq!(
        server.keys("lake", "wh/models/m2/"),
        vec!["wh/models/m2/manifest-00000000000000000001.json"]
    );
    // m's last manifest says it was dropped.
    assert_eq!(
        server.keys("lake", "wh/models/m/"),
        vec![
            "wh/models/m/manifest-00000000000000000001.json",
            "wh/models/m/manifest-00000000000000000002.json"
        ]
    );
}

/// A model in S3 cannot name external data outside its folder by escaping `..` in the URL.
#[test]
fn an_s3_models_external_data_stays_in_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let external = Path::new("data/fixtures/external");
    let mut bytes = std::fs::read(external.join("model.onnx")).unwrap();
    while let Some(at) = bytes.windows(11).position(|w| w == b"weights.bin") {
        bytes[at..at + 11].copy_from_slice(b"%2e%2e/w.bn");
    }
    let model = dir.path().join("esc.onnx");
    std::fs::write(&model, bytes).unwrap();
    server.put_file("lake", "models/m/esc.onnx", &model);
    server.put_file("lake", "models/w.bn", &external.join("weights.bin"));
    let out = server.lake_warehouse()(
        "CREATE MODEL esc FROM 's3://lake/models/m/esc.onnx'; SELECT predict('esc', [1.0, 1, 1, 1, 1, 1, 1, 1, 1, 1]) AS p",
    )
    .output()
    .unwrap();
    assert_failure(&out, &["model 'esc'", "external data"]);
}

/// The score of row 0 of the sample features by the model file `file`, from a process of its own.
fn score_of(file: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "CREATE MODEL m FROM '{file}'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0"
    );
    let out = assert_ok(&query(&dir.path().join("wh"), &sql));
    out.lines().nth(1).unwrap().to_string()
}

/// Results never come from a stale model: a process running statements one after another (a
/// shell reading a pipe) scores, at each statement, with the model the warehouse defines then,
/// whatever another process redefined or dropped meanwhile, the same file with new bytes
/// included. (A file changed on disk without a redefinition keeps its loaded model.)
#[test]
fn a_model_redefined_by_another_process_is_used_from_the_next_statement() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let file = dir.path().join("m.onnx");
    std::fs::copy("data/models/linear.onnx", &file).unwrap();
    let (linear, doubled) = (
        score_of("data/models/linear.onnx"),
        score_of("data/fixtures/linear_doubled.onnx"),
    );
    assert_ne!(linear, doubled);
    let elsewhere = |sql: &str| {
        let out = common::output_within(
            bin().arg("--warehouse").arg(&wh).args(["query", "-e", sql]),
            common::DEADLINE,
        );
        assert_ok(&out);
    };
    elsewhere(&format!("CREATE MODEL m FROM '{}'", file.display()));

    let mut command = bin();
    command.arg("--warehouse").arg(&wh).arg("shell");
    let (mut shell, mut stdin, out, err) = piped(&mut command);
    let mut score = || {
        writeln!(
            stdin,
            "SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0;"
        )
        .unwrap();
        loop {
            let line = out
                .recv_timeout(common::DEADLINE)
                .expect("the shell answers");
            if line != "s" {
                return line;
            }
        }
    };
    assert_eq!(score(), linear);
    // The file changes, nobody redefines the model: the loaded model keeps serving.
    std::fs::copy("data/fixtures/linear_doubled.onnx", &file).unwrap();
    assert_eq!(score(), linear);
    // Another process redefines it from that same file: its new bytes from the next statement.
    elsewhere(&format!(
        "CREATE OR REPLACE MODEL m FROM '{}'",
        file.display()
    ));
    assert_eq!(score(), doubled);
    // From another file.
    elsewhere("CREATE OR REPLACE MODEL m FROM 'data/models/linear.onnx'");
    assert_eq!(score(), linear);
    // Dropped: the shell no longer has it.
    elsewhere("DROP MODEL m");
    writeln!(
        stdin,
        "SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0;"
    )
    .unwrap();
    loop {
        let line = err
            .recv_timeout(common::DEADLINE)
            .expect("the shell reports the error");
        if line.contains("unknown model 'm'") {
            break;
        }
    }
    drop(stdin);
    wait_with_deadline(&mut shell, common::DEADLINE, "the shell");
}

/// A model dropped or redefined after it scored in the same process: the statement succeeds
/// (its counts of scored rows go with the old model), and the warehouse says what it did.
#[test]
fn a_model_used_then_redefined_or_dropped_in_one_process_reports_success() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let sql = format!(
        "CREATE MODEL m FROM 'data/models/linear.onnx'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0; \
         CREATE OR REPLACE MODEL m FROM 'data/fixtures/linear_doubled.onnx'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0; \
         DROP MODEL m"
    );
    let out = assert_ok(&query(&wh, &sql));
    let expected = format!(
        "s\n{}\ns\n{}\n",
        score_of("data/models/linear.onnx"),
        score_of("data/fixtures/linear_doubled.onnx")
    );
    assert_eq!(out, expected);
    assert!(!wh.join("models/m.json").exists());
    assert_eq!(
        assert_ok(&query(
            &wh,
            "SELECT count(*) AS n FROM models() WHERE name = 'm'"
        )),
        "n\n0\n"
    );
}

/// A model of `--models` is its file: a statement that would redefine or drop it (and leave a
/// definition the file hides in the next process) is refused, and a warehouse definition the
/// folder hides is said at start.
#[test]
fn models_of_the_models_folder_are_not_redefined_by_statements() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    for sql in [
        "CREATE OR REPLACE MODEL linear FROM 'data/fixtures/linear_doubled.onnx'",
        "DROP MODEL linear",
    ] {
        let out = query(&wh, sql);
        assert_failure(&out, &["model 'linear' is a file of --models"]);
        assert!(!wh.join("models/linear.json").exists() && !wh.join("models/linear").exists());
    }
    // Defined in the warehouse by a process without --models, then hidden by the folder's file.
    let out = common::output_within(
        bin().arg("--warehouse").arg(&wh).args([
            "query",
            "-e",
            "CREATE MODEL linear FROM 'data/fixtures/linear_doubled.onnx'",
        ]),
        common::DEADLINE,
    );
    assert_ok(&out);
    let out = query(
        &wh,
        "SELECT predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS s \
         FROM 'data/sample/features.parquet' WHERE id = 0",
    );
    assert_eq!(
        assert_ok(&out),
        format!("s\n{}\n", score_of("data/models/linear.onnx"))
    );
    assert!(
        common::stderr(&out).contains("warning: model 'linear' of --models"),
        "{}",
        common::stderr(&out)
    );
}

/// A model definition in the warehouse that cannot be read (empty, not JSON) is left out with a
/// warning: the other models and the statements go on, and DROP MODEL IF EXISTS removes it.
#[test]
fn one_unreadable_model_definition_does_not_take_the_warehouse_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE MODEL m FROM 'data/models/linear.onnx'"));
    std::fs::write(wh.join("models/bad.json"), "").unwrap();
    let score = format!("SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0");
    let out = query(&wh, &score);
    assert_eq!(
        assert_ok(&out),
        format!("s\n{}\n", score_of("data/models/linear.onnx"))
    );
    let err = common::stderr(&out);
    assert!(
        err.contains("warning: a model definition is left out")
            && err.contains("bad.json is not valid JSON"),
        "{err}"
    );
    // One that is JSON but no definition says what it lacks.
    std::fs::write(wh.join("models/bad.json"), r#"{"sha256": "ab"}"#).unwrap();
    let err = common::stderr(&query(&wh, &score));
    assert!(
        err.contains(r#"bad.json has no "source": not a model definition"#),
        "{err}"
    );
    assert_ok(&query(&wh, "DROP MODEL IF EXISTS bad"));
    assert!(!wh.join("models/bad.json").exists());
    let out = query(&wh, &score);
    assert_ok(&out);
    assert_eq!(common::stderr(&out), "");
}

#[test]
fn models_folder_names_are_names_and_one_models_each() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("dup")).unwrap();
    for file in [
        "x.y.onnx",
        ".hidden.onnx",
        "p%20q.onnx",
        "ok.onnx",
        "dup.onnx",
    ] {
        std::fs::copy("data/models/linear.onnx", models.join(file)).unwrap();
    }
    std::fs::copy("data/models/lookup.onnx", models.join("dup/model.onnx")).unwrap();
    let with_models = |sql: &str| {
        common::output_within(
            bin()
                .arg("--warehouse")
                .arg(dir.path().join("wh"))
                .arg("--models")
                .arg(&models)
                .args(["query", "-e", sql]),
            common::DEADLINE,
        )
    };
    let out = with_models("SELECT name FROM models() ORDER BY name");
    assert_eq!(assert_ok(&out), "name\ndup\nok\n");
    let err = common::stderr(&out);
    for file in ["x.y.onnx", ".hidden.onnx", "p%20q.onnx", "dup/model.onnx"] {
        assert!(
            err.contains(&format!("warning: {file} in")),
            "{file}: {err}"
        );
    }
    // `dup` is dup.onnx (the linear model), not the folder's.
    let out = with_models("DESCRIBE MODEL dup");
    assert!(assert_ok(&out).contains("[N, 10]"), "{}", stdout(&out));
}

#[test]
fn an_unreadable_model_definition_can_be_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE MODEL m FROM 'data/models/linear.onnx'"));
    std::fs::write(wh.join("models/broken.json"), "not json").unwrap();
    let out = query(&wh, "DROP MODEL broken");
    assert_ok(&out);
    assert!(!wh.join("models/broken.json").exists());
    assert!(wh.join("models/m").exists());
    assert_failure(
        &query(&wh, "DROP MODEL broken"),
        &["unknown model 'broken'"],
    );
}
