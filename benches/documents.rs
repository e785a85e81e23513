//! The text of every page of a folder of PDFs: batchinfer's `SELECT count(*), sum(length(text))
//! FROM read_document(...)` against `benches/documents/pypdfium2_pages.py` (pypdfium2, the same
//! pdfium, in one Python process), each contender a process of its own, in turn (A B A B), wall
//! time and peak memory (batchinfer's and its workers'). Then batchinfer held to one core (its
//! workers too), for pages a second per core, and its peak over 10 and 50 copies of the folder,
//! for memory flat in the number of files.
//!
//! The PDFs are the manuals of four Debian packages (scripts/documents.sh: 11 files, 1,014
//! pages), copied 10 times under other names (10,140 pages).
//!
//! ```sh
//! cargo bench --bench documents                 # 3 rounds
//! cargo bench --bench documents -- --repeat 5
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{arg, run_measured_saying};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// `copies` copies of the PDFs of `corpus` in `folder` (hard links, under other names), made
/// once.
fn copies_of(corpus: &Path, folder: &Path, copies: usize) {
    let pdfs: Vec<PathBuf> = std::fs::read_dir(corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pdf"))
        .collect();
    if std::fs::read_dir(folder).is_ok_and(|d| d.count() == pdfs.len() * copies) {
        return;
    }
    let _ = std::fs::remove_dir_all(folder);
    std::fs::create_dir_all(folder).unwrap();
    for copy in 0..copies {
        for pdf in &pdfs {
            let name = format!("{copy}-{}", pdf.file_name().unwrap().to_string_lossy());
            std::fs::hard_link(pdf, folder.join(name)).unwrap();
        }
    }
}

/// Pages and characters, as both contenders print them (the last two numbers said).
fn counted(said: &str) -> (u64, u64) {
    let numbers: Vec<u64> = said
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers.as_slice() {
        [.., pages, characters] => (*pages, *characters),
        _ => (0, 0),
    }
}

fn main() {
    let repeat: usize = arg("--repeat").and_then(|v| v.parse().ok()).unwrap_or(3);
    let out = Command::new("scripts/documents.sh").output().unwrap();
    assert!(out.status.success(), "scripts/documents.sh");
    let corpus = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let python = corpus.join("python/bin/python");
    let dir = PathBuf::from("target/bench-data/documents");
    let ten = dir.join("pdf-10");
    copies_of(&corpus.join("pdf"), &ten, 10);
    let batchinfer = |folder: &Path, pinned: bool| {
        let sql = format!(
            "SELECT count(*) AS pages, sum(length(text)) AS characters FROM read_document('{}/')",
            folder.display()
        );
        let program = env!("CARGO_BIN_EXE_batchinfer");
        let mut c = Command::new(if pinned { "taskset" } else { program });
        if pinned {
            c.args(["-c", "0", program]);
        }
        c.arg("--warehouse")
            .arg(dir.join("wh"))
            .args(["--format", "csv", "query", "-e", &sql]);
        c
    };
    let python_run = |folder: &Path| {
        let mut c = Command::new(&python);
        c.arg("benches/documents/pypdfium2_pages.py").arg(folder);
        c
    };
    // Each contender's output, read for its counts: the two must read the same.
    let run = |name: &str, command: Command| {
        let printed = dir.join(format!("{}.out", name.replace(' ', "-")));
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("exec \"$0\" \"$@\" > '{}'", printed.display()));
        shell.arg(command.get_program()).args(command.get_args());
        let (seconds, peak, _) = run_measured_saying(name, shell);
        let said = std::fs::read_to_string(&printed).unwrap_or_default();
        (seconds, peak, counted(&said))
    };
    println!("{} (10 copies of 11 PDFs), {repeat} rounds", ten.display());
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..repeat {
        let a = run("batchinfer", batchinfer(&ten, false));
        let b = run("pypdfium2", python_run(&ten));
        assert_eq!(a.2, b.2, "both read the same pages and characters");
        println!(
            "round {i}: batchinfer {:.2} s ({:.0} MiB), pypdfium2 {:.2} s ({:.0} MiB): {} pages, \
             {} characters",
            a.0, a.1, b.0, b.1, a.2.0, a.2.1
        );
        ratios.push(b.0 / a.0);
        ours.push(a);
        theirs.push(b);
    }
    let pages = ours[0].2.0 as f64;
    let wall = |v: &[(f64, f64, (u64, u64))]| median(v.iter().map(|r| r.0).collect());
    let peak = |v: &[(f64, f64, (u64, u64))]| median(v.iter().map(|r| r.1).collect());
    println!(
        "batchinfer: {:.2} s, {:.0} pages/s, {:.0} MiB | pypdfium2, one process: {:.2} s, {:.0} \
         pages/s, {:.0} MiB | batchinfer's throughput over pypdfium2's {:.2}x (median of rounds)",
        wall(&ours),
        pages / wall(&ours),
        peak(&ours),
        wall(&theirs),
        pages / wall(&theirs),
        peak(&theirs),
        median(ratios)
    );
    let one_core: Vec<f64> = (0..repeat)
        .map(|_| run("batchinfer on one core", batchinfer(&ten, true)).0)
        .collect();
    println!(
        "batchinfer on one core: {:.2} s, {:.0} pages/s",
        median(one_core.clone()),
        pages / median(one_core)
    );
    let fifty = dir.join("pdf-50");
    copies_of(&corpus.join("pdf"), &fifty, 50);
    let small = run("batchinfer, 10 copies", batchinfer(&ten, false));
    let large = run("batchinfer, 50 copies", batchinfer(&fifty, false));
    println!(
        "batchinfer's peak over 110 files ({} pages): {:.0} MiB; over 550 files ({} pages): \
         {:.0} MiB",
        small.2.0, small.1, large.2.0, large.1
    );
}
