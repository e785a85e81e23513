//! Documents as rows: `read_document` over real PDF manuals of Debian packages against pdfium's
//! own text (pypdfium2), over python-docx's own Word documents against python-docx, and over
//! real web pages against lxml (tests/documents/reference.py); a scanned page, an encrypted PDF
//! and a file that is no document each its own row; a view over a folder of documents that
//! follows it file by file. What they read is fetched by scripts/documents.sh.

mod common;
mod fixtures;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::assert_ok;

/// The folder scripts/documents.sh fills: pdf/, docx/, html/, made/, python/.
fn corpus() -> PathBuf {
    fixtures::made_by("documents.sh", &[])
}

fn query(warehouse: &Path, sql: &str) -> std::process::Output {
    common::query_with(warehouse, &[], sql)
}

/// `read_document`'s rows of the files of `folders`, as newline-delimited JSON in `out`.
fn rows_as_json(warehouse: &Path, folders: &[PathBuf], out: &Path) {
    let select: Vec<String> = folders
        .iter()
        .map(|folder| {
            format!(
                "SELECT filename, page, pages, text, has_text, error FROM read_document('{}/')",
                folder.display()
            )
        })
        .collect();
    assert_ok(&query(
        warehouse,
        &format!(
            "COPY ({}) TO '{}' STORED AS JSON",
            select.join(" UNION ALL "),
            out.display()
        ),
    ));
}

/// The JSON report a reference script of tests/documents/ prints, run by the corpus's Python
/// with `args`.
fn python_report(corpus: &Path, script: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(corpus.join("python/bin/python"))
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn pages_words_and_paragraphs_match_pdfium_python_docx_and_lxml() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let rows = dir.path().join("rows.json");
    let folders = ["pdf", "docx", "html"].map(|kind| corpus.join(kind));
    rows_as_json(&wh, &folders, &rows);
    let report = python_report(
        &corpus,
        "tests/documents/reference.py",
        &[rows.as_os_str(), corpus.as_os_str()],
    );
    for (kind, least) in [("pdf", 1000), ("docx", 40), ("html", 100)] {
        let of = &report[kind];
        let compared = of["compared"].as_u64().unwrap();
        let equal = of["equal"].as_u64().unwrap();
        assert!(
            of["missing"].as_array().unwrap().is_empty(),
            "{kind}: files whose rows are not the reference's pages: {of}"
        );
        assert!(compared >= least, "{kind}: only {compared} compared: {of}");
        // At least 95% equal after whitespace is normalized, and the rest within 2% (edit
        // distance over the reference's length).
        assert!(
            equal * 100 >= compared * 95,
            "{kind}: {equal} of {compared} equal: {of}"
        );
        assert!(of["worst"].as_f64().unwrap() <= 0.02, "{kind}: {of}");
    }
}

#[test]
fn a_scanned_page_an_encrypted_pdf_and_a_photo_are_rows_of_their_own() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("in");
    std::fs::create_dir_all(&folder).unwrap();
    for (from, to) in [
        ("made/scanned.pdf", "scanned.pdf"),
        ("made/locked.pdf", "locked.pdf"),
        ("pdf/pixel.pdf", "pixel.pdf"),
        ("docx/test.docx", "test.docx"),
    ] {
        std::fs::copy(corpus.join(from), folder.join(to)).unwrap();
    }
    // A photo, a truncated PDF and an empty text file beside them.
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    std::fs::write(folder.join("photo.png"), png).unwrap();
    let bash = std::fs::read(corpus.join("pdf/bash.pdf")).unwrap();
    std::fs::write(folder.join("cut.pdf"), &bash[..bash.len() / 3]).unwrap();
    std::fs::write(folder.join("notes.md"), "# Notes\n\nA line.\n").unwrap();
    let out = assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "SELECT regexp_replace(filename, '.*/', '') AS file, page, pages, has_text, \
             length(text) AS chars, error IS NOT NULL AS failed, error FROM read_document('{}/') \
             ORDER BY file, page",
            folder.display()
        ),
    ));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    let row = |file: &str| -> Vec<&str> {
        rows.iter()
            .filter(|r| r.starts_with(&format!("{file},")))
            .copied()
            .collect()
    };
    // The scanned page: no text layer, an empty text, no error.
    assert_eq!(
        row("scanned.pdf"),
        ["scanned.pdf,1,1,false,0,false,"],
        "{out}"
    );
    // The encrypted PDF: one row, its error.
    let locked = row("locked.pdf");
    assert_eq!(locked.len(), 1, "{out}");
    assert!(
        locked[0].starts_with("locked.pdf,,,,,true,")
            && locked[0].contains("encrypted")
            && locked[0].contains("locked.pdf"),
        "{out}"
    );
    let photo = row("photo.png");
    assert!(
        photo.len() == 1 && photo[0].contains("not a document read_document reads"),
        "{out}"
    );
    // A PDF cut to a third: pdfium reads what it can, or says why not; never the statement's.
    assert!(!row("cut.pdf").is_empty(), "{out}");
    assert_eq!(row("notes.md"), ["notes.md,1,1,true,17,false,"], "{out}");
    assert_eq!(row("test.docx").len(), 1, "{out}");
    assert!(row("pixel.pdf")[0].starts_with("pixel.pdf,1,1,"), "{out}");
}

#[test]
fn chunks_fit_the_model_by_its_own_tokenizer_and_end_at_sentences() {
    let corpus = corpus();
    let models = fixtures::models_with_minilm();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let (pages, chunks) = (
        dir.path().join("pages.json"),
        dir.path().join("chunks.json"),
    );
    let pdf = corpus.join("pdf");
    let models_flag = ["--models", models.to_str().unwrap()];
    assert_ok(&common::query_with(
        &wh,
        &models_flag,
        &format!(
            "COPY (SELECT filename, page, text FROM read_document('{}/')) TO '{}' STORED AS JSON",
            pdf.display(),
            pages.display()
        ),
    ));
    assert_ok(&common::query_with(
        &wh,
        &models_flag,
        &format!(
            "COPY (SELECT filename, page, c.text AS text, c.char_start AS char_start, \
             c.char_end AS char_end, c.tokens AS tokens FROM (SELECT filename, page, \
             unnest(chunk(text, 'minilm', 128, 16)) AS c FROM read_document('{}/'))) TO '{}' \
             STORED AS JSON",
            pdf.display(),
            chunks.display()
        ),
    ));
    let tokenizer = models.join("minilm/tokenizer.json");
    let report = python_report(
        &corpus,
        "tests/documents/chunks.py",
        &[
            pages.as_os_str(),
            chunks.as_os_str(),
            tokenizer.as_os_str(),
            "128".as_ref(),
        ],
    );
    let count = |key: &str| report[key].as_u64().unwrap_or(0);
    assert!(
        count("pages") >= 1000 && count("chunks") >= 2000,
        "{report}"
    );
    for wrong in [
        "offsets wrong",
        "token counts differ",
        "over max_tokens",
        "characters in no chunk",
    ] {
        assert_eq!(count(wrong), 0, "{wrong}: {report}");
    }
    // Where a chunk ends: at a sentence's or paragraph's end far more often than a window cut
    // blind, and within a word hardly ever.
    let share = |of: &str, key: &str| report[of][key].as_f64().unwrap_or(0.0);
    let sentences = |of: &str| share(of, "sentence") + share(of, "paragraph");
    assert!(
        sentences("ends") >= 0.5 && sentences("ends") >= 3.0 * sentences("baseline ends"),
        "{report}"
    );
    assert!(share("ends", "within a word") <= 0.01, "{report}");

    // Korean: MiniLM's tokenizer makes several tokens of a syllable, sharing its place; a chunk
    // never ends within one, and the chunks give back the text.
    let korean = "한국어 문장입니다. ".repeat(40);
    let out = assert_ok(&common::query_with(
        &wh,
        &models_flag,
        &format!(
            "SELECT c.char_start AS s, c.char_end AS e, c.tokens AS n, \
             substr(t, c.char_start + 1, c.char_end - c.char_start) = c.text AS same \
             FROM (SELECT t, unnest(chunk(t, 'minilm', 16, 2)) AS c FROM (SELECT '{korean}' AS t))"
        ),
    ));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!(rows.len() > 10, "{out}");
    for row in &rows {
        let fields: Vec<&str> = row.split(',').collect();
        assert_eq!(fields[3], "true", "{out}");
        assert!(fields[2].parse::<usize>().unwrap() <= 16, "{out}");
    }
}

/// A PDF of the objects `bodies` (object k + 1 each), with its cross-reference table.
fn pdf(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"%PDF-1.7\n".to_vec();
    let mut offsets = Vec::new();
    for (k, body) in bodies.iter().enumerate() {
        offsets.push(out.len());
        out.extend(format!("{} 0 obj\n", k + 1).as_bytes());
        out.extend(body);
        out.extend(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend(format!("xref\n0 {}\n0000000000 65535 f \n", bodies.len() + 1).as_bytes());
    for offset in offsets {
        out.extend(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            bodies.len() + 1
        )
        .as_bytes(),
    );
    out
}

fn stream(content: &str, extra: &str) -> Vec<u8> {
    format!(
        "<< /Length {}{extra} >>\nstream\n{content}\nendstream",
        content.len()
    )
    .into_bytes()
}

#[test]
fn a_pdf_that_exhausts_pdfium_and_a_damaged_page_fail_alone() {
    const HELLO: &str = "BT /F1 12 Tf 72 720 Td (Hello world) Tj ET";
    const FONT: &str = "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>";
    let page = |resources: &str| {
        format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources {resources} /Contents 4 0 R >>")
            .into_bytes()
    };
    let form = "/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources 8 0 R";
    // Two forms that draw each other four times each: pdfium allocates until it is stopped.
    let forms = pdf(&[
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [5 0 R] /Count 1 >>".to_vec(),
        FONT.as_bytes().to_vec(),
        stream("/A Do", ""),
        page("8 0 R"),
        stream(
            &format!("{HELLO} /B Do /B Do /B Do /B Do"),
            &format!(" {form}"),
        ),
        stream(
            &format!("{HELLO} /A Do /A Do /A Do /A Do"),
            &format!(" {form}"),
        ),
        b"<< /Font << /F1 3 0 R >> /XObject << /A 6 0 R /B 7 0 R >> >>".to_vec(),
    ]);
    // Three pages, the second an object that is not there.
    let fonts = "<< /Font << /F1 3 0 R >> >>";
    let holed = pdf(&[
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [5 0 R 99 0 R 6 0 R] /Count 3 >>".to_vec(),
        FONT.as_bytes().to_vec(),
        stream(HELLO, ""),
        page(fonts),
        page(fonts),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("in");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("forms.pdf"), forms).unwrap();
    std::fs::write(folder.join("holed.pdf"), holed).unwrap();
    std::fs::write(folder.join("notes.txt"), "still read").unwrap();
    let out = assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "SELECT regexp_replace(filename, '.*/', '') AS file, page, text, error \
             FROM read_document('{}/') ORDER BY file, page",
            folder.display()
        ),
    ));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(
        rows[0].starts_with("forms.pdf,,,") && rows[0].contains("pdfium failed on it"),
        "{out}"
    );
    assert_eq!(rows[1], "holed.pdf,1,Hello world,", "{out}");
    assert!(
        rows[2].starts_with("holed.pdf,2,,") && rows[2].contains("page 2 of the PDF"),
        "{out}"
    );
    assert_eq!(rows[3], "holed.pdf,3,Hello world,", "{out}");
    assert_eq!(rows[4], "notes.txt,1,still read,", "{out}");
}

#[test]
fn a_view_over_a_folder_of_documents_follows_it_file_by_file() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let folder = dir.path().join("docs");
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["CAD.pdf", "asyRefCard.pdf"] {
        std::fs::copy(corpus.join("pdf").join(name), folder.join(name)).unwrap();
    }
    let select = format!(
        "SELECT filename, page, length(text) AS chars FROM read_document('{}/')",
        folder.display()
    );
    assert_ok(&query(
        &wh,
        &format!("CREATE MATERIALIZED VIEW pages AS {select}"),
    ));
    let same = || {
        let view = assert_ok(&query(&wh, "SELECT * FROM pages ORDER BY filename, page"));
        let now = assert_ok(&query(&wh, &format!("{select} ORDER BY filename, page")));
        assert_eq!(view, now);
        view.lines().count() - 1
    };
    let before = same();
    assert!(before > 2, "a page a row");

    // A new manual is read alone; an encrypted one is left out, named.
    std::fs::copy(
        corpus.join("pdf/xfig-howto.pdf"),
        folder.join("xfig-howto.pdf"),
    )
    .unwrap();
    std::fs::copy(corpus.join("made/locked.pdf"), folder.join("locked.pdf")).unwrap();
    let out = common::refresh(&wh, "pages");
    let said = format!(
        "{}{}",
        assert_ok(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("left out") && said.contains("locked.pdf") && said.contains("encrypted"),
        "{said}"
    );
    let added = assert_ok(&query(
        &wh,
        "SELECT count(*) AS n FROM pages WHERE filename LIKE '%xfig-howto.pdf'",
    ));
    assert_ne!(added, "n\n0\n");

    // A removed manual's pages go.
    std::fs::remove_file(folder.join("CAD.pdf")).unwrap();
    std::fs::remove_file(folder.join("locked.pdf")).unwrap();
    assert_ok(&common::refresh(&wh, "pages"));
    let gone = assert_ok(&query(
        &wh,
        "SELECT count(*) AS n FROM pages WHERE filename LIKE '%CAD.pdf'",
    ));
    assert_eq!(gone, "n\n0\n");
    same();
}
