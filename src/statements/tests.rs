use super::*;
use datafusion::sql::sqlparser::dialect::GenericDialect;

fn split(script: &str) -> Result<Vec<Statement>> {
    parse(script, &GenericDialect {})
}

fn sql(text: &str) -> Statement {
    split(text).unwrap().remove(0)
}

#[test]
fn secrets_are_blanked_and_the_rest_kept_as_written() {
    let blank = |t: &str| blank_secrets(t, &GenericDialect {});
    assert_eq!(
        blank("COPY t TO 'x' OPTIONS ('aws.secret_access_key' 'abc', 'aws.region' 'it''s');"),
        "COPY t TO 'x' OPTIONS ('aws.secret_access_key' '<redacted>', 'aws.region' 'it''s');"
    );
    assert_eq!(
        blank("SET aws.secret_access_key TO 'abc'"),
        "SET aws.secret_access_key TO '<redacted>'"
    );
    assert_eq!(blank("SET password = 'abc'"), "SET password = '<redacted>'");
    // A password given in any form SQL has for a value.
    for value in ["\"abc\"", "abc", "987654321", "N'abc'", "$$abc$$"] {
        assert_eq!(
            blank(&format!("OPTIONS ('user' 'u', 'pass' {value}, 'db' 'd')")),
            "OPTIONS ('user' 'u', 'pass' '<redacted>', 'db' 'd')",
            "{value}"
        );
    }
    assert_eq!(
        blank("SELECT 'passage' FROM tokens WHERE token = 1"),
        "SELECT 'passage' FROM tokens WHERE token = '<redacted>'"
    );
    assert_eq!(
        blank("SELECT \"a\"\"b\", 'x\ny' FROM t"),
        "SELECT \"a\"\"b\", 'x\ny' FROM t"
    );
    assert_eq!(
        blank("SELECT * FROM 's3://u:pw@b/x'"),
        "SELECT * FROM 's3://u:REDACTED@b/x'"
    );
    // Unfinished: the URLs' passwords still go.
    assert_eq!(
        blank("SELECT 'http://u:pw@h/"),
        "SELECT 'http://u:REDACTED@h/"
    );
}

#[test]
fn scripts_split_at_top_level_semicolons_only() {
    let script = "SELECT 'a;b' AS x; -- a comment; with a semicolon\nSELECT 2 /* ; */ ;;  ";
    let statements = split(script).unwrap();
    assert_eq!(statements, vec![sql("SELECT 'a;b' AS x"), sql("SELECT 2")]);
}

#[test]
fn model_statements_are_recognized() {
    let statements = split(
        "create model Churn from 'models/churn.onnx'; CREATE OR REPLACE MODEL \"MiniLM\" FROM 'm/' OPTIONS ('quantize' 'INT8');\
         SHOW MODELS; describe model churn; DROP MODEL IF EXISTS churn; DROP MODEL x",
    )
    .unwrap();
    assert_eq!(
        statements,
        vec![
            Statement::Model(ModelStatement::Create {
                name: "churn".into(),
                source: "models/churn.onnx".into(),
                or_replace: false,
                quantize: None,
            }),
            Statement::Model(ModelStatement::Create {
                name: "MiniLM".into(),
                source: "m/".into(),
                or_replace: true,
                quantize: Some("int8".into()),
            }),
            Statement::Model(ModelStatement::Show),
            Statement::Model(ModelStatement::Describe {
                name: "churn".into()
            }),
            Statement::Model(ModelStatement::Drop {
                name: "churn".into(),
                if_exists: true
            }),
            Statement::Model(ModelStatement::Drop {
                name: "x".into(),
                if_exists: false
            }),
        ]
    );
}

#[test]
fn model_versions_and_aliases_are_recognized_and_hostile_ones_refused() {
    let statements = split(
        "ALTER MODEL churn ADD VERSION FROM 'v2.onnx'; alter model Churn set alias Champion to \
         version 1; ALTER MODEL churn DROP ALIAS champion; ALTER MODEL churn DROP VERSION 12; \
         SHOW MODEL VERSIONS churn",
    )
    .unwrap();
    assert_eq!(
        statements,
        vec![
            Statement::Model(ModelStatement::AddVersion {
                name: "churn".into(),
                source: "v2.onnx".into(),
                quantize: None,
            }),
            Statement::Model(ModelStatement::SetAlias {
                name: "churn".into(),
                alias: "champion".into(),
                version: 1,
            }),
            Statement::Model(ModelStatement::DropAlias {
                name: "churn".into(),
                alias: "champion".into(),
            }),
            Statement::Model(ModelStatement::DropVersion {
                name: "churn".into(),
                version: 12,
            }),
            Statement::Model(ModelStatement::ShowVersions {
                name: "churn".into()
            }),
        ]
    );
    let long = format!("ALTER MODEL m DROP VERSION {}", "9".repeat(300));
    for hostile in [
        "ALTER MODEL m SET ALIAS \"../x\" TO VERSION 1",
        "ALTER MODEL m SET ALIAS a TO VERSION 0",
        "ALTER MODEL m SET ALIAS a TO VERSION 1.5",
        "ALTER MODEL m DROP VERSION '1/../2'",
        long.as_str(),
        "ALTER MODEL m ADD VERSION 'x.onnx'",
        "ALTER MODEL m RENAME TO n",
    ] {
        assert!(split(hostile).is_err(), "{hostile}");
    }
}

#[test]
fn view_statements_are_recognized() {
    let statements = split(
        "CREATE MATERIALIZED VIEW s AS SELECT a FROM 'x/'; refresh materialized view S;\
         SHOW MATERIALIZED VIEWS; DROP MATERIALIZED VIEW IF EXISTS s; CREATE VIEW v AS SELECT 1",
    )
    .unwrap();
    assert!(matches!(
        &statements[0],
        Statement::View(ViewStatement::Create { name, or_replace: false, .. }) if name.to_string() == "s"
    ));
    assert!(matches!(
        &statements[1],
        Statement::View(ViewStatement::Refresh { name }) if name.to_string() == "S"
    ));
    assert_eq!(statements[2], Statement::View(ViewStatement::Show));
    assert!(matches!(
        &statements[3],
        Statement::View(ViewStatement::Drop {
            if_exists: true,
            ..
        })
    ));
    assert!(matches!(&statements[4], Statement::Sql(_)));
    let err = split("REFRESH MATERIALIZED VIEW").unwrap_err().to_string();
    assert!(err.contains("expected a view name"), "{err}");
    let explained = split("EXPLAIN COST REFRESH MATERIALIZED VIEW s").unwrap();
    assert!(matches!(
        &explained[0],
        Statement::ExplainCostRefresh(name) if name.to_string() == "s"
    ));
    let err = split("EXPLAIN COST SHOW MATERIALIZED VIEWS")
        .unwrap_err()
        .to_string();
    assert!(err.contains("REFRESH MATERIALIZED VIEW"), "{err}");
}

#[test]
fn malformed_model_statements_say_what_is_expected() {
    let err = split("CREATE MODEL churn 'x.onnx'")
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected FROM after the model name"), "{err}");
    let err = split("CREATE MODEL churn FROM x").unwrap_err().to_string();
    assert!(
        err.contains("expected the model's path as a quoted string"),
        "{err}"
    );
    let err = split("CREATE MODEL m FROM 'x' OPTIONS ('quantize' 'int4')")
        .unwrap_err()
        .to_string();
    assert!(err.contains("quantize 'int4' is not supported"), "{err}");
    let err = split("CREATE MODEL m FROM 'x' OPTIONS ('speed' 'fast')")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown model option 'speed'"), "{err}");
    let err = split("CREATE MODEL m FROM 'x' OPTIONS ('quantize' 'int8', 'QUANTIZE' 'int8')")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the option 'QUANTIZE' is given twice"),
        "{err}"
    );
    let err = split("CREATE MODEL m FROM 'x' OPTIONS 'quantize'")
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected OPTIONS ('key' 'value'"), "{err}");
    let err = split("SHOW MODELS now").unwrap_err().to_string();
    assert!(err.contains("expected the end of the statement"), "{err}");
    // Other CREATE statements are DataFusion's.
    assert!(matches!(
        &split("CREATE TABLE t AS SELECT 1").unwrap()[0],
        Statement::Sql(_)
    ));
}

#[test]
fn complete_statements_end_at_a_semicolon_outside_strings() {
    fn prefix(t: &str) -> &str {
        &t[..complete_prefix(t, &GenericDialect {})]
    }
    assert_eq!(prefix("SELECT 1;\nSELECT 2"), "SELECT 1;");
    // A ';' inside a string literal, at the end of its line, ends nothing.
    assert_eq!(prefix("SELECT 'a;\nb';\nSELECT"), "SELECT 'a;\nb';");
    assert_eq!(prefix("SELECT 'a;\n"), "");
    assert_eq!(prefix("SELECT 'é;' AS x; SELECT"), "SELECT 'é;' AS x;");
    assert_eq!(prefix("-- only a comment;\n"), "");
}
