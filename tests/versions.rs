//! Model versions and aliases through the real binary: `name`, `name@N` and `name@alias` score
//! with the bytes each version was registered with (a file changed or deleted since changes
//! nothing), aliases follow ALTER MODEL, concurrent processes lose no version and no alias,
//! locally and in a warehouse in S3 (s3s over HTTP), a view over an alias is rebuilt when the
//! alias moves, outputs name the version, and hostile names touch nothing. The reference scores
//! are the files' own, scored by `--models` (no warehouse, no versions) in a process apart.

mod common;
mod fixtures;
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{assert_failure, assert_ok, bin, output_within, stderr, stdout};

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";
const DATA: &str = "data/sample/features.parquet";
const LINEAR: &str = "data/models/linear.onnx";
const DOUBLED: &str = "data/fixtures/linear_doubled.onnx";

/// Runs `sql` with the warehouse `wh` (no `--models`).
fn run(wh: &Path, sql: &str) -> Output {
    output_within(
        bin().arg("--warehouse").arg(wh).args(["query", "-e", sql]),
        common::DEADLINE,
    )
}

/// The rows `predict` of the file `model` gives for ids below 50, scored through `--models`
/// (the file as it is, in a process without a warehouse).
fn reference(model: &str) -> Vec<(i64, Vec<f64>)> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(model, dir.path().join("m.onnx")).unwrap();
    let out = output_within(
        bin().arg("--models").arg(dir.path()).args([
            "query",
            "-e",
            &format!("SELECT id, predict('m', {FEATURES}) AS p FROM '{DATA}' WHERE id < 50"),
        ]),
        common::DEADLINE,
    );
    common::rows(&assert_ok(&out))
}

/// The rows of `predict(name)` for ids below 50, in the warehouse `wh`.
fn scores(wh: &Path, name: &str) -> Vec<(i64, Vec<f64>)> {
    let sql = format!("SELECT id, predict('{name}', {FEATURES}) AS p FROM '{DATA}' WHERE id < 50");
    common::rows(&assert_ok(&run(wh, &sql)))
}

/// SHOW MODEL VERSIONS `name`, as (version, sha256, source, aliases, picked) per line.
fn versions(wh: &Path, name: &str) -> Vec<(u32, String, String, String, bool)> {
    parse_versions(&assert_ok(&run(wh, &format!("SHOW MODEL VERSIONS {name}"))))
}

/// The CSV of SHOW MODEL VERSIONS (version, sha256, beside_sha256, source, created, aliases,
/// picked, kept).
fn parse_versions(csv: &str) -> Vec<(u32, String, String, String, bool)> {
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("version,sha256,beside_sha256,source,created,aliases,picked,kept")
    );
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f = fields(l);
            (
                f[0].parse().unwrap(),
                f[1].clone(),
                f[3].clone(),
                f[5].clone(),
                f[6] == "true",
            )
        })
        .collect()
}

/// The fields of one CSV line (quoted fields may hold commas).
fn fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// A copy of `model` at `dir/name`, absolute.
fn copy_of(model: &str, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(model, &path).unwrap();
    std::fs::canonicalize(path).unwrap()
}

#[test]
fn each_name_scores_with_the_bytes_its_version_was_registered_with() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let (want_linear, want_doubled) = (reference(LINEAR), reference(DOUBLED));
    assert_eq!(want_linear.len(), 50);
    assert_ne!(want_linear, want_doubled);

    // One path, retrained in place: each registration keeps the bytes it read.
    let file = copy_of(LINEAR, dir.path(), "churn.onnx");
    let out = run(
        &wh,
        &format!("CREATE MODEL churn FROM '{}'", file.display()),
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("model 'churn' created as version 1 from"),
        "{}",
        stderr(&out)
    );
    std::fs::copy(DOUBLED, &file).unwrap();
    let out = run(
        &wh,
        &format!("ALTER MODEL churn ADD VERSION FROM '{}'", file.display()),
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("model 'churn' version 2 added from"),
        "{}",
        stderr(&out)
    );
    // The file is gone: nothing changes.
    std::fs::remove_file(&file).unwrap();
    common::assert_same_rows(&scores(&wh, "churn@1"), &want_linear, 0.0);
    common::assert_same_rows(&scores(&wh, "churn@2"), &want_doubled, 0.0);
    common::assert_same_rows(&scores(&wh, "churn"), &want_doubled, 0.0);

    // Aliases: named, and `default` is what the name alone picks.
    assert_ok(&run(
        &wh,
        "ALTER MODEL churn SET ALIAS champion TO VERSION 1",
    ));
    common::assert_same_rows(&scores(&wh, "churn@champion"), &want_linear, 0.0);
    assert_ok(&run(
        &wh,
        "ALTER MODEL churn SET ALIAS default TO VERSION 1",
    ));
    common::assert_same_rows(&scores(&wh, "churn"), &want_linear, 0.0);
    assert_ok(&run(&wh, "ALTER MODEL churn DROP ALIAS default"));
    common::assert_same_rows(&scores(&wh, "churn"), &want_doubled, 0.0);

    // SHOW MODEL VERSIONS: the sha256 of the bytes each registration read, the path named.
    let shown = versions(&wh, "churn");
    let source = file.display().to_string();
    assert_eq!(
        shown,
        vec![
            (
                1,
                common::sha256_of(LINEAR),
                source.clone(),
                "champion".into(),
                false
            ),
            (
                2,
                common::sha256_of(DOUBLED),
                source.clone(),
                "".into(),
                true
            ),
        ]
    );
    // models(): the version the name picks and the aliases.
    let listed = assert_ok(&run(
        &wh,
        "SELECT name, version, aliases, sha256 FROM models() ORDER BY name",
    ));
    assert_eq!(
        listed.lines().nth(1).unwrap(),
        format!("churn,2,champion -> 1,{}", common::sha256_of(DOUBLED))
    );

    // Provenance: each output names the model, the version, the alias and the sha256.
    let target = dir.path().join("out.parquet");
    assert_ok(&run(
        &wh,
        &format!(
            "COPY (SELECT predict('churn@champion', {FEATURES}) AS a, predict('churn', {FEATURES}) \
             AS b FROM '{DATA}' LIMIT 5) TO '{}'",
            target.display()
        ),
    ));
    let lineage: serde_json::Value =
        serde_json::from_str(&common::parquet_footer_value(&target, "batchinfer.models").unwrap())
            .unwrap();
    let by_name = |name: &str| {
        lineage
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {lineage}"))
            .clone()
    };
    let champion = by_name("churn@champion");
    assert_eq!(champion["model"], "churn");
    assert_eq!(champion["version"], 1);
    assert_eq!(champion["alias"], "champion");
    assert_eq!(champion["sha256"], common::sha256_of(LINEAR));
    assert_eq!(champion["source"], source);
    assert!(
        champion["kept"].as_str().unwrap().contains("/model-files/"),
        "{champion}"
    );
    let newest = by_name("churn");
    assert_eq!(newest["version"], 2);
    assert!(newest.get("alias").is_none(), "{newest}");
    assert_eq!(newest["sha256"], common::sha256_of(DOUBLED));

    // predict_table reaches a version too (of a model whose inputs are the table's columns).
    let out = assert_ok(&run(
        &wh,
        "CREATE MODEL c FROM 'data/models/churn.onnx'; \
         SELECT count(label) AS n FROM predict_table('c@1', 'data/sample/customers.parquet'); \
         SELECT count(*) AS n FROM 'data/sample/customers.parquet'",
    ));
    let counts: Vec<&str> = out.lines().filter(|l| *l != "n").collect();
    assert!(counts.len() == 2 && counts[0] == counts[1], "{out}");

    // A version an alias names stays; the last version stays; numbers are never given twice.
    assert_failure(
        &run(&wh, "ALTER MODEL churn DROP VERSION 1"),
        &["version 1 of model 'churn' is named by the alias champion"],
    );
    assert_failure(
        &run(&wh, "ALTER MODEL churn SET ALIAS champion TO VERSION 7"),
        &["model 'churn' has no version 7 (its versions: 1, 2)"],
    );
    assert_failure(
        &run(&wh, "SELECT predict('churn@7', 1.0)"),
        &["model 'churn' has no version 7", "its versions are 1, 2"],
    );
    assert_failure(
        &run(&wh, "SELECT predict('churn@nope', 1.0)"),
        &["model 'churn' has no alias 'nope'", "champion -> 1"],
    );
    assert_ok(&run(&wh, "ALTER MODEL churn DROP ALIAS champion"));
    assert_ok(&run(&wh, "ALTER MODEL churn DROP VERSION 2"));
    assert_failure(
        &run(&wh, "ALTER MODEL churn DROP VERSION 1"),
        &["the only version of model 'churn'", "DROP MODEL churn"],
    );
    let out = run(
        &wh,
        &format!("CREATE OR REPLACE MODEL churn FROM '{DOUBLED}'"),
    );
    assert!(
        stderr(&assert_ok_out(out)).contains("model 'churn' defined as version 3"),
        "version 3 after 2 was dropped"
    );
    common::assert_same_rows(&scores(&wh, "churn@1"), &want_linear, 0.0);
    common::assert_same_rows(&scores(&wh, "churn"), &want_doubled, 0.0);
    assert_failure(
        &run(&wh, "SELECT predict('churn@2', 1.0)"),
        &["model 'churn' has no version 2", "its versions are 1, 3"],
    );

    // CREATE MODEL of a model there is: refused, pointing at the statements that add versions.
    assert_failure(
        &run(&wh, &format!("CREATE MODEL churn FROM '{LINEAR}'")),
        &[
            "model 'churn' already exists",
            "ALTER MODEL churn ADD VERSION",
        ],
    );
    // DROP MODEL: every version and alias gone.
    assert_ok(&run(&wh, "DROP MODEL churn"));
    assert_failure(
        &run(&wh, "SELECT predict('churn@1', 1.0)"),
        &["model 'churn@1'"],
    );
    assert_failure(&run(&wh, "SHOW MODEL VERSIONS churn"), &["'churn'"]);
    assert_failure(
        &run(&wh, "ALTER MODEL churn SET ALIAS x TO VERSION 1"),
        &["the warehouse defines no model 'churn'"],
    );
    // Made anew, it counts from 1.
    let out = run(&wh, &format!("CREATE MODEL churn FROM '{LINEAR}'"));
    assert!(
        stderr(&assert_ok_out(out)).contains("created as version 1"),
        "a new model"
    );
}

fn assert_ok_out(out: Output) -> Output {
    assert_ok(&out);
    out
}

/// Hostile versions and aliases are refused, saying what a name may be, and change nothing in
/// the warehouse.
#[test]
fn hostile_versions_and_aliases_are_refused_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&run(&wh, &format!("CREATE MODEL m FROM '{LINEAR}'")));
    let before = common::snapshot(&wh);
    let long = "9".repeat(300);
    for (sql, expected) in [
        (
            format!("SELECT predict('m@../x', {FEATURES}) FROM '{DATA}'"),
            "cannot be named",
        ),
        (
            format!("SELECT predict('m@1/../2', {FEATURES}) FROM '{DATA}'"),
            "cannot be named",
        ),
        (
            format!("SELECT predict('m@{long}', {FEATURES}) FROM '{DATA}'"),
            "at most 9 digits, not 300",
        ),
        (
            format!("SELECT predict('../m@1', {FEATURES}) FROM '{DATA}'"),
            "'../m@1'",
        ),
        (
            "ALTER MODEL m SET ALIAS \"../x\" TO VERSION 1".to_string(),
            "is not usable",
        ),
        (
            format!("ALTER MODEL m SET ALIAS champion TO VERSION {long}"),
            "at most 9 digits",
        ),
        (
            "ALTER MODEL m DROP VERSION 0".to_string(),
            "without a leading zero",
        ),
        (
            "ALTER MODEL \"../m\" SET ALIAS a TO VERSION 1".to_string(),
            "model name \"../m\" is not usable",
        ),
        (
            "ALTER MODEL m ADD VERSION FROM '/nonexistent/x.onnx'".to_string(),
            "no model at",
        ),
    ] {
        assert_failure(&run(&wh, &sql), &[expected]);
    }
    assert!(
        common::changes(&before, &common::snapshot(&wh)).is_empty(),
        "the warehouse changed"
    );

    // Manifests written by hand that no statement makes: one clear error each, no panic.
    let newest = common::newest_manifest_file(&wh.join("models/m"));
    let text = std::fs::read_to_string(&newest).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let write = |json: &serde_json::Value| {
        std::fs::write(
            wh.join("models/m/manifest-00000000000000000009.json"),
            json.to_string(),
        )
        .unwrap()
    };
    let mut at_the_end = json.clone();
    at_the_end["versions"]["next"] = u32::MAX.into();
    write(&at_the_end);
    assert_failure(
        &run(&wh, &format!("ALTER MODEL m ADD VERSION FROM '{DOUBLED}'")),
        &["the most a model has"],
    );
    let mut twice = json.clone();
    let first = twice["versions"]["versions"][0].clone();
    twice["versions"]["versions"]
        .as_array_mut()
        .unwrap()
        .push(first);
    write(&twice);
    let out = run(&wh, "SELECT name FROM models()");
    assert_ok(&out);
    assert!(
        stderr(&out).contains("version 1 is there twice"),
        "{}",
        stderr(&out)
    );
    let mut upper = json.clone();
    let sha = upper["versions"]["versions"][0]["sha256"]
        .as_str()
        .unwrap()
        .to_uppercase();
    upper["versions"]["versions"][0]["sha256"] = sha.into();
    write(&upper);
    let out = run(&wh, "SELECT name FROM models()");
    assert!(
        stderr(&out).contains("sha256 is not a sha256"),
        "{}",
        stderr(&out)
    );
    let mut escaping = json.clone();
    escaping["versions"]["versions"][0]["source"] = "../../elsewhere/model.onnx".into();
    write(&escaping);
    let out = run(&wh, "SELECT name FROM models()");
    assert!(
        stderr(&out).contains("is not a file of the warehouse"),
        "{}",
        stderr(&out)
    );
    let mut dangling = json.clone();
    dangling["versions"]["aliases"]["../x"] = 1.into();
    write(&dangling);
    let out = run(&wh, "SELECT name FROM models()");
    assert!(stderr(&out).contains("is refused"), "{}", stderr(&out));
    // DROP MODEL removes even a definition that cannot be read.
    assert_ok(&run(&wh, "DROP MODEL m"));
    assert_eq!(assert_ok(&run(&wh, "SELECT name FROM models()")), "name\n");
}

/// Processes adding versions at once each get a number of their own; processes setting one
/// alias at once leave it on one of the versions they set.
fn concurrent_changes_lose_nothing(start: impl Fn(&str) -> Command, models: [&str; 2]) {
    assert_ok(&output_within(
        &mut start(&format!("CREATE MODEL m FROM '{}'", models[0])),
        common::DEADLINE,
    ));
    let writers = 6;
    let children: Vec<_> = (0..writers)
        .map(|i| {
            let sql = format!("ALTER MODEL m ADD VERSION FROM '{}'", models[i % 2]);
            start(&sql)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut numbers = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let err = stderr(&assert_ok_out(out));
        let number: u32 = err
            .split("version ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{err}"));
        numbers.push(number);
    }
    numbers.sort();
    assert_eq!(numbers, (2..=writers as u32 + 1).collect::<Vec<_>>());
    let shown = assert_ok(&output_within(
        &mut start("SHOW MODEL VERSIONS m"),
        common::DEADLINE,
    ));
    let shown = parse_versions(&shown);
    assert_eq!(shown.len(), writers + 1, "{shown:?}");

    let targets: Vec<u32> = (2..=writers as u32 + 1).collect();
    let children: Vec<_> = targets
        .iter()
        .map(|v| {
            start(&format!("ALTER MODEL m SET ALIAS champion TO VERSION {v}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        assert_ok(&child.wait_with_output().unwrap());
    }
    let listed = assert_ok(&output_within(
        &mut start("SELECT aliases FROM models() WHERE name = 'm'"),
        common::DEADLINE,
    ));
    let alias = listed.lines().nth(1).unwrap().to_string();
    let on: u32 = alias
        .strip_prefix("champion -> ")
        .unwrap_or_else(|| panic!("{alias}"))
        .parse()
        .unwrap();
    assert!(targets.contains(&on), "{alias}");
    // It scores with that version's bytes.
    let sha = &shown.iter().find(|v| v.0 == on).unwrap().1;
    let file = if *sha == common::sha256_of(LINEAR) {
        LINEAR
    } else {
        DOUBLED
    };
    let sql =
        format!("SELECT id, predict('m@champion', {FEATURES}) AS p FROM '{DATA}' WHERE id < 50");
    let got = common::rows(&assert_ok(&output_within(
        &mut start(&sql),
        common::DEADLINE,
    )));
    common::assert_same_rows(&got, &reference(file), 0.0);
}

#[test]
fn concurrent_versions_and_aliases_lose_nothing_locally() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let linear = std::fs::canonicalize(LINEAR).unwrap();
    let doubled = std::fs::canonicalize(DOUBLED).unwrap();
    concurrent_changes_lose_nothing(
        |sql| {
            let mut command = bin();
            command
                .arg("--warehouse")
                .arg(&wh)
                .args(["query", "-e", sql]);
            command
        },
        [
            &linear.display().to_string(),
            &doubled.display().to_string(),
        ],
    );
}

#[test]
fn versions_in_a_warehouse_in_s3() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.put_file("models", "linear.onnx", Path::new(LINEAR));
    server.put_file("models", "doubled.onnx", Path::new(DOUBLED));
    server.bucket("lake");
    let start = server.lake_warehouse();
    concurrent_changes_lose_nothing(
        &start,
        ["s3://models/linear.onnx", "s3://models/doubled.onnx"],
    );
    // The bytes are the warehouse's: the source object replaced, version 1 scores as before.
    server.put_file("models", "linear.onnx", Path::new(DOUBLED));
    let sql = format!("SELECT id, predict('m@1', {FEATURES}) AS p FROM '{DATA}' WHERE id < 50");
    let got = common::rows(&assert_ok(&output_within(
        &mut start(&sql),
        common::DEADLINE,
    )));
    common::assert_same_rows(&got, &reference(LINEAR), 0.0);
    let kept = server.keys("lake", "wh/model-files/");
    assert!(
        kept.iter()
            .any(|k| k.contains(&common::sha256_of(LINEAR)) && k.ends_with("model.onnx")),
        "{kept:?}"
    );
    let manifests = server.keys("lake", "wh/models/m/");
    assert!(manifests.len() >= 2, "{manifests:?}");
}

/// A view over `m@champion` records the version it scored with; when the alias moves, SHOW
/// MATERIALIZED VIEWS says so, readers keep the old rows, and the next refresh rebuilds the view
/// with the new version.
#[test]
fn a_view_over_an_alias_is_rebuilt_when_the_alias_moves() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let (want_linear, want_doubled) = (reference(LINEAR), reference(DOUBLED));
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    assert_ok(&run(
        &wh,
        &format!(
            "COPY (SELECT * FROM '{DATA}' WHERE id < 50) TO '{}' STORED AS PARQUET",
            input.join("part-0.parquet").display()
        ),
    ));
    assert_ok(&run(
        &wh,
        &format!(
            "CREATE MODEL m FROM '{LINEAR}'; ALTER MODEL m ADD VERSION FROM '{DOUBLED}'; \
             ALTER MODEL m SET ALIAS champion TO VERSION 1; \
             CREATE MATERIALIZED VIEW v AS SELECT id, predict('m@champion', {FEATURES}) AS p \
             FROM '{}/'; REFRESH MATERIALIZED VIEW v",
            input.display()
        ),
    ));
    let read = || common::rows(&assert_ok(&run(&wh, "SELECT id, p FROM v")));
    let state = || assert_ok(&run(&wh, "SHOW MATERIALIZED VIEWS"));
    common::assert_same_rows(&read(), &want_linear, 0.0);
    assert!(state().contains(",current,"), "{}", state());

    assert_ok(&run(&wh, "ALTER MODEL m SET ALIAS champion TO VERSION 2"));
    let shown = state();
    assert!(shown.contains("model changed (m@champion)"), "{shown}");
    common::assert_same_rows(&read(), &want_linear, 0.0);

    let out = run(&wh, "REFRESH MATERIALIZED VIEW v");
    assert_ok(&out);
    common::assert_same_rows(&read(), &want_doubled, 0.0);
    assert!(state().contains(",current,"), "{}", state());
    // Moving it back rebuilds it again.
    assert_ok(&run(
        &wh,
        "ALTER MODEL m SET ALIAS champion TO VERSION 1; REFRESH MATERIALIZED VIEW v",
    ));
    common::assert_same_rows(&read(), &want_linear, 0.0);
    let _ = stdout(&out);
    // The model dropped: the view says so, and keeps its rows.
    assert_ok(&run(&wh, "DROP MODEL m"));
    assert!(
        state().contains("model missing (m@champion)"),
        "{}",
        state()
    );
    common::assert_same_rows(&read(), &want_linear, 0.0);
}

/// A warehouse moved, then copied and the original removed, keeps scoring each version with
/// its own kept files.
#[test]
fn a_warehouse_moved_or_copied_keeps_its_versions() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&run(
        &wh,
        &format!("CREATE MODEL m FROM '{LINEAR}'; ALTER MODEL m ADD VERSION FROM '{DOUBLED}'"),
    ));
    let moved = dir.path().join("moved");
    std::fs::rename(&wh, &moved).unwrap();
    common::assert_same_rows(&scores(&moved, "m@1"), &reference(LINEAR), 0.0);
    let copy = dir.path().join("copy");
    let status = Command::new("cp")
        .arg("-r")
        .arg(&moved)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_dir_all(&moved).unwrap();
    common::assert_same_rows(&scores(&copy, "m@1"), &reference(LINEAR), 0.0);
    common::assert_same_rows(&scores(&copy, "m"), &reference(DOUBLED), 0.0);
    let kept = assert_ok(&run(&copy, "SHOW MODEL VERSIONS m"));
    assert!(
        kept.contains(&copy.display().to_string()),
        "the copy's own files: {kept}"
    );
}

/// An endpoint model's versions are its definitions: each name reaches the definition of its
/// version (DESCRIBE MODEL says which; no request is sent).
#[test]
fn an_endpoint_models_versions_are_its_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = |model: &str| {
        format!(
            "CREATE OR REPLACE MODEL e OPTIONS ('endpoint' 'http://127.0.0.1:9/v1', 'model' \
             '{model}')"
        )
    };
    assert_ok(&run(&wh, &define("first")));
    assert_ok(&run(&wh, &define("second")));
    let describe = |name: &str| assert_ok(&run(&wh, &format!("DESCRIBE MODEL {name}")));
    let (one, two) = (describe("\"e@1\""), describe("e"));
    assert!(one.contains("first") && !one.contains("second"), "{one}");
    assert!(two.contains("second"), "{two}");
    let shown = versions(&wh, "e");
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(shown[1].4, "the newest is picked");
}

/// A text model's version keeps its tokenizer and settings: the folder it was registered from
/// changed (vectors not normalized, texts cut to 2 tokens) or removed, `embed` of each version
/// gives what the folder gave when it was registered, against `--models` over the original.
#[test]
fn a_text_models_version_keeps_its_tokenizer_and_settings() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let original = fixtures::fetch_model("all-MiniLM-L6-v2");
    let folder = dir.path().join("minilm");
    std::fs::create_dir_all(&folder).unwrap();
    for entry in common::files_under(&original) {
        let target = folder.join(entry.strip_prefix(&original).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &target).unwrap();
    }
    let sentences = "SELECT id, embed('{name}', body) AS v FROM 'data/sample/sentences.parquet' \
                     WHERE id < 20";
    let want = {
        let models = dir.path().join("reference");
        std::fs::create_dir_all(&models).unwrap();
        std::os::unix::fs::symlink(&original, models.join("minilm")).unwrap();
        let out = output_within(
            bin().arg("--models").arg(&models).args([
                "query",
                "-e",
                &sentences.replace("{name}", "minilm"),
            ]),
            common::DEADLINE,
        );
        common::rows(&assert_ok(&out))
    };
    assert_eq!(want.len(), 20);
    assert_ok(&run(
        &wh,
        &format!("CREATE MODEL t FROM '{}/'", folder.display()),
    ));
    // Other settings in the folder: vectors not normalized (no Normalize module), every text
    // cut to 2 tokens. The version keeps its own.
    std::fs::write(folder.join("modules.json"), "[]").unwrap();
    std::fs::write(
        folder.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 2, "do_lower_case": false}"#,
    )
    .unwrap();
    let got = common::rows(&assert_ok(&run(&wh, &sentences.replace("{name}", "t@1"))));
    common::assert_same_rows(&got, &want, 1e-5);
    std::fs::remove_dir_all(&folder).unwrap();
    let got = common::rows(&assert_ok(&run(&wh, &sentences.replace("{name}", "t"))));
    common::assert_same_rows(&got, &want, 1e-5);
    // Kept by the model's sha256 with that of the files beside it.
    let kept: Vec<PathBuf> = common::files_under(&wh.join("model-files"));
    let tokenizer = kept
        .iter()
        .find(|p| p.ends_with("tokenizer.json"))
        .expect("the tokenizer is kept");
    let key = tokenizer
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let sha = common::sha256_of(original.join("model.onnx"));
    assert!(key.starts_with(&format!("{sha}-")), "{key}");
    assert_eq!(
        std::fs::read(tokenizer).unwrap(),
        std::fs::read(original.join("tokenizer.json")).unwrap()
    );
    // A kept file changed by hand (the same JSON and a space): refused by its sha256, naming
    // the version and the way back.
    let mut changed = std::fs::read(tokenizer).unwrap();
    changed.push(b' ');
    std::fs::write(tokenizer, changed).unwrap();
    assert_failure(
        &run(&wh, &sentences.replace("{name}", "t@1")),
        &[
            "version 1 of model 't'",
            "changed or damaged",
            "ALTER MODEL t ADD VERSION FROM",
        ],
    );
}

/// A quantized version is kept as quantized, naming the model it was made from.
#[test]
fn a_quantized_version_names_what_it_was_made_from() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let mlp = "data/models/churn_mlp.onnx";
    assert_ok(&run(
        &wh,
        &format!(
            "CREATE MODEL q FROM '{mlp}' OPTIONS ('quantize' 'int8'); \
             ALTER MODEL q ADD VERSION FROM '{mlp}'"
        ),
    ));
    let shown = versions(&wh, "q");
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert_ne!(shown[0].1, common::sha256_of(mlp), "version 1 is quantized");
    assert_eq!(shown[1].1, common::sha256_of(mlp));
    let target = dir.path().join("q.parquet");
    assert_ok(&run(
        &wh,
        &format!(
            "COPY (SELECT predict('q@1', city, age, spend) AS p FROM \
             'data/sample/customers.parquet' LIMIT 3) TO '{}'",
            target.display()
        ),
    ));
    let lineage = common::parquet_footer_value(&target, "batchinfer.models").unwrap();
    assert!(
        lineage.contains(&format!(
            "\"quantized_from_sha256\":\"{}\"",
            common::sha256_of(mlp)
        )) && lineage.contains("\"version\":1"),
        "{lineage}"
    );
}
