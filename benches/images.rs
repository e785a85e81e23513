//! open_nsfw over a folder of photos: batchinfer's `COPY (SELECT filename, predict('nsfw',
//! content)[2] ...) FROM read_blob(...)` against `benches/python_images.py` (Pillow + numpy +
//! onnxruntime in batches of 64, the same preparation; alone, and with a pool of 2 processes
//! preparing the photos), each contender a process of its own, in turn (A B C A B C), wall time
//! and peak RSS. The photos are JPEG copies of scikit-image's colour sample photos, resized to 1
//! to 12 megapixels (made here by Pillow, once); the model and photos come from
//! scripts/image_models.sh. Then batchinfer's peak over 1,000 and 10,000 small photos, for
//! memory that stays flat.
//!
//! ```sh
//! cargo bench --bench images                     # 1,000 photos, 2 rounds
//! cargo bench --bench images -- --photos 200 --repeat 3
//! cargo bench --bench images -- --small-only     # the peaks over small photos alone
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{arg, run_measured_saying};

/// The number before `word` in `said` (`"12.3 s in the model"`), NaN where there is none.
fn seconds_before(said: &str, word: &str) -> f64 {
    said.find(word)
        .and_then(|at| said[..at].split_whitespace().last())
        .and_then(|n| n.trim_end_matches(" s").parse().ok())
        .unwrap_or(f64::NAN)
}

/// A contender's run: wall seconds, peak MiB, and seconds inside onnxruntime.
struct Run {
    seconds: f64,
    peak: f64,
    model: f64,
}

/// Runs `command`, reading the time inside the model from what it says: batchinfer's
/// `--timing` line ("... 12.3 s in the model"), the Python script's ("onnxruntime 12.3 s").
fn run(name: &str, command: Command) -> Run {
    let (seconds, peak, said) = run_measured_saying(name, command);
    let model = match seconds_before(&said, " s in the model") {
        m if m.is_nan() => said
            .split("onnxruntime ")
            .nth(1)
            .and_then(|rest| rest.split(" s").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(f64::NAN),
        m => m,
    };
    Run {
        seconds,
        peak,
        model,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// Makes `n` JPEG photos in `folder` (once): the colour sample photos resized to 1, 2, ... 12
/// megapixels in turn (`small`: to 0.1 megapixels each).
fn make_photos(python: &Path, photos: &Path, folder: &Path, n: usize, small: bool) {
    if std::fs::read_dir(folder).is_ok_and(|d| d.count() == n) {
        return;
    }
    let _ = std::fs::remove_dir_all(folder);
    std::fs::create_dir_all(folder).unwrap();
    let script = r#"
import os, sys
from PIL import Image
photos, folder, n, small = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "small"
names = [f for f in sorted(os.listdir(photos)) if f.endswith((".png", ".jpg"))]
sources = [Image.open(os.path.join(photos, f)).convert("RGB") for f in names]
sources = [s for s, f in zip(sources, names) if Image.open(os.path.join(photos, f)).mode == "RGB"]
for i in range(n):
    source = sources[i % len(sources)]
    megapixels = 0.1 if small else 1 + i % 12
    scale = (megapixels * 1e6 / (source.width * source.height)) ** 0.5
    size = (round(source.width * scale), round(source.height * scale))
    source.resize(size, Image.BICUBIC).save(os.path.join(folder, f"{i:05}.jpg"), quality=90)
"#;
    let ok = Command::new(python)
        .args(["-c", script])
        .arg(photos)
        .arg(folder)
        .arg(n.to_string())
        .arg(if small { "small" } else { "large" })
        .status()
        .unwrap();
    assert!(ok.success(), "making the photos");
}

fn main() {
    let n: usize = arg("--photos").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let repeat: usize = arg("--repeat").and_then(|v| v.parse().ok()).unwrap_or(2);
    let out = Command::new("scripts/image_models.sh").output().unwrap();
    assert!(out.status.success());
    let assets = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let python = assets.join("python/bin/python");
    let model = assets.join("nsfw/model.onnx");
    let dir = PathBuf::from("target/bench-data/images");
    let photos = dir.join(format!("photos-{n}"));
    make_photos(&python, &assets.join("photos"), &photos, n, false);
    let batchinfer = |folder: &Path, out: &str| {
        let sql = format!(
            "CREATE OR REPLACE MODEL nsfw FROM '{}'; COPY (SELECT filename, predict('nsfw', \
             content)[2] AS nsfw FROM read_blob('{}/')) TO '{out}'",
            model.display(),
            folder.display()
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.arg("--warehouse")
            .arg(dir.join("wh"))
            .args(["--timing", "query", "-e", &sql]);
        c
    };
    let python_run = |out: &str, processes: usize| {
        let mut c = Command::new(&python);
        c.arg("benches/python_images.py")
            .arg(&model)
            .arg(&photos)
            .arg(out);
        if processes > 0 {
            c.args(["--processes", &processes.to_string()]);
        }
        c
    };
    // `--small-only`: the memory over 1,000 and 10,000 small photos alone.
    let small_only = std::env::args().any(|a| a == "--small-only");
    println!("{n} photos (1 to 12 megapixels, JPEG), open_nsfw, {repeat} rounds");
    let (mut ours, mut single, mut pool) = (Vec::new(), Vec::new(), Vec::new());
    let (mut over_single, mut over_pool) = (Vec::new(), Vec::new());
    // The model's share: batchinfer's time during which the model ran (decoding the next run of
    // photos meanwhile, on the other cores), Python's time inside session.run (preparing between
    // runs, in the main process or by waiting for the pool).
    let said = |r: &Run| {
        format!(
            "{:.2} s ({:.0} MiB; {:.2} s in the model, {:.2} s not)",
            r.seconds,
            r.peak,
            r.model,
            r.seconds - r.model
        )
    };
    for i in (0..repeat).filter(|_| !small_only) {
        let out = |who: &str| dir.join(format!("{who}{i}.parquet")).display().to_string();
        let a = run("batchinfer", batchinfer(&photos, &out("ours")));
        let b = run("python", python_run(&out("python"), 0));
        let c = run("python, 2 processes", python_run(&out("pool"), 2));
        over_single.push(b.seconds / a.seconds);
        over_pool.push(c.seconds / a.seconds);
        println!(
            "round {i}: batchinfer {}, python {}, python with 2 processes {}",
            said(&a),
            said(&b),
            said(&c)
        );
        ours.push(a);
        single.push(b);
        pool.push(c);
    }
    let med = |v: &[Run], f: fn(&Run) -> f64| median(v.iter().map(f).collect());
    let summary = |v: &[Run]| {
        format!(
            "{:.2} s {:.0} MiB, model {:.2} s",
            med(v, |r| r.seconds),
            med(v, |r| r.peak),
            med(v, |r| r.model)
        )
    };
    if !small_only {
        println!(
            "batchinfer: {}, {:.1} photos/s | python: {} | python, 2 processes: {} | \
             batchinfer's throughput over python's {:.2}x, over the pool's {:.2}x (medians of \
             rounds)",
            summary(&ours),
            n as f64 / med(&ours, |r| r.seconds),
            summary(&single),
            summary(&pool),
            median(over_single),
            median(over_pool)
        );
    }
    // Memory over 1,000 and 10,000 photos (small ones, for time: 0.1 megapixels; the 10,000
    // are the 1,000 under ten names each).
    let small = dir.join("small-1000");
    make_photos(&python, &assets.join("photos"), &small, 1000, true);
    let many = dir.join("small-10000");
    if std::fs::read_dir(&many).map_or(0, |d| d.count()) != 10_000 {
        let _ = std::fs::remove_dir_all(&many);
        std::fs::create_dir_all(&many).unwrap();
        for entry in std::fs::read_dir(&small).unwrap() {
            let path = entry.unwrap().path();
            for copy in 0..10 {
                let name = format!("{copy}-{}", path.file_name().unwrap().to_string_lossy());
                std::fs::hard_link(&path, many.join(name)).unwrap();
            }
        }
    }
    let out = dir.join("small.parquet").display().to_string();
    let one = run("batchinfer, 1,000 small photos", batchinfer(&small, &out));
    let ten = run("batchinfer, 10,000 small photos", batchinfer(&many, &out));
    println!(
        "batchinfer over 1,000 small photos: {}; over 10,000: {}",
        said(&one),
        said(&ten)
    );
}
