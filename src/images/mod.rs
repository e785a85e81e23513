//! Images as model inputs. A model folder declares its preprocessing, in Hugging Face's
//! `preprocessor_config.json` or in `batchinfer.json`'s `"image"` ([`ImageSpec::from_files`]);
//! `predict('model', content)` over a BLOB column then turns each image into the model's input:
//! decoded, turned as its EXIF orientation says, made RGB (or BGR), resized as Pillow resizes,
//! centre-cropped and normalized, in the declared layout (`decode.rs`, `column.rs`). An image
//! that cannot be read is its row's error, never the process's.

pub mod column;
pub mod decode;
mod resample;

use serde_json::Value;

use crate::error::{Error, Result};

/// How a model's images are prepared, as its folder declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// The size images are resized to first (None: as they are).
    pub resize: Option<Resize>,
    pub filter: Filter,
    /// The centre crop taken after the resize: (width, height).
    pub crop: Option<(u32, u32)>,
    pub channels: Channels,
    pub layout: Layout,
    /// Each value is `(pixel * scale - mean[c]) / std[c]`, channels in the order fed.
    pub scale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Which file said so, for DESCRIBE MODEL and messages.
    pub declared_in: String,
}

/// The size an image is resized to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resize {
    /// Exactly (width, height).
    Exact(u32, u32),
    /// The shorter side to this, the other in proportion (Hugging Face's `shortest_edge`).
    ShortestEdge(u32),
}

/// Pillow's resampling filters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Filter {
    Nearest,
    Bilinear,
    Bicubic,
    Lanczos,
    Box,
    Hamming,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Channels {
    Rgb,
    Bgr,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layout {
    /// [N, 3, height, width]
    Nchw,
    /// [N, height, width, 3]
    Nhwc,
}

/// The most pixels of a prepared image (4096 x 4096): the values of one take 192 MiB.
pub const MAX_PREPARED_PIXELS: u64 = 4096 * 4096;

/// The files beside a model that may declare how its images are prepared.
pub const IMAGE_FILES: &[&str] = &["batchinfer.json", "preprocessor_config.json"];

impl ImageSpec {
    /// The preprocessing `files` (name, bytes) declare: `batchinfer.json`'s `"image"` first,
    /// else `preprocessor_config.json`; None where neither does.
    pub fn from_files(files: &[(&str, Vec<u8>)]) -> Result<Option<ImageSpec>> {
        let json = |name: &str| -> Result<Option<Value>> {
            match files.iter().find(|(f, _)| *f == name) {
                Some((_, bytes)) => serde_json::from_slice(bytes)
                    .map(Some)
                    .map_err(|e| Error::ModelFile(format!("{name} is not JSON: {e}"))),
                None => Ok(None),
            }
        };
        if let Some(image) = json("batchinfer.json")?.and_then(|v| v.get("image").cloned()) {
            return Self::from_batchinfer(&image)
                .map(Some)
                .map_err(|e| Error::ModelFile(format!("batchinfer.json, \"image\": {e}")));
        }
        // An image processor's (an audio model's feature extractor has one too, of no image).
        const IMAGE_KEYS: &[&str] = &[
            "image_processor_type",
            "image_mean",
            "image_std",
            "crop_size",
            "do_center_crop",
            "resample",
        ];
        if let Some(config) = json("preprocessor_config.json")?
            .filter(|c| IMAGE_KEYS.iter().any(|k| c.get(k).is_some()))
        {
            return Self::from_hugging_face(&config)
                .map(Some)
                .map_err(|e| Error::ModelFile(format!("preprocessor_config.json: {e}")));
        }
        Ok(None)
    }

    /// `{"resize": [256, 256] | {"shortest_edge": 256}, "filter": "bilinear", "crop": [224,
    /// 224], "channels": "RGB" | "BGR", "layout": "NCHW" | "NHWC", "mean": [...], "std":
    /// [...], "scale": 0.00392}`; sizes are [width, height].
    fn from_batchinfer(image: &Value) -> std::result::Result<ImageSpec, BadSpec> {
        let object = image.as_object().ok_or(BadSpec::NotAnObject)?;
        if let Some(key) = object
            .keys()
            .find(|k| !BATCHINFER_KEYS.contains(&k.as_str()))
        {
            return Err(BadSpec::UnknownKey(key.clone()));
        }
        let resize = match image.get("resize") {
            None | Some(Value::Null) => None,
            Some(object @ Value::Object(o)) => Some(Resize::ShortestEdge(side(
                o.get("shortest_edge").ok_or_else(|| {
                    expected(
                        "resize",
                        "[width, height] or {\"shortest_edge\": N}",
                        object,
                    )
                })?,
                "resize.shortest_edge",
            )?)),
            Some(v) => {
                let (w, h) = pair(v, "resize")?;
                Some(Resize::Exact(w, h))
            }
        };
        let filter = match image.get("filter") {
            None => Filter::Bilinear,
            Some(v) => Filter::parse(v.as_str().ok_or_else(|| expected("filter", "a name", v))?)?,
        };
        let crop = image.get("crop").map(|v| pair(v, "crop")).transpose()?;
        let channels = match image.get("channels") {
            None => Channels::Rgb,
            Some(Value::String(c)) if c.eq_ignore_ascii_case("rgb") => Channels::Rgb,
            Some(Value::String(c)) if c.eq_ignore_ascii_case("bgr") => Channels::Bgr,
            Some(c) => return Err(expected("channels", "\"RGB\" or \"BGR\"", c)),
        };
        let layout = match image.get("layout") {
            None => Layout::Nchw,
            Some(Value::String(l)) if l.eq_ignore_ascii_case("nchw") => Layout::Nchw,
            Some(Value::String(l)) if l.eq_ignore_ascii_case("nhwc") => Layout::Nhwc,
            Some(l) => return Err(expected("layout", "\"NCHW\" or \"NHWC\"", l)),
        };
        let spec = ImageSpec {
            resize,
            filter,
            crop,
            channels,
            layout,
            scale: number(image.get("scale"), "scale")?.unwrap_or(1.0),
            mean: triple(image.get("mean"), "mean")?.unwrap_or([0.0; 3]),
            std: triple(image.get("std"), "std")?.unwrap_or([1.0; 3]),
            declared_in: "batchinfer.json".into(),
        };
        spec.check()
    }

    /// Hugging Face's image processor settings (`do_resize`, `size`, `resample`,
    /// `do_center_crop`, `crop_size`, `do_rescale`, `rescale_factor`, `do_normalize`,
    /// `image_mean`, `image_std`): RGB, NCHW.
    fn from_hugging_face(config: &Value) -> std::result::Result<ImageSpec, BadSpec> {
        let on = |key: &'static str, default: bool| -> std::result::Result<bool, BadSpec> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(expected(key, "true or false", v)),
            }
        };
        let resize = match (on("do_resize", true)?, config.get("size")) {
            (false, _) | (true, None) => None,
            (true, Some(size)) => Some(hugging_face_size(size, "size", true)?),
        };
        let filter = match config.get("resample") {
            None => Filter::Bilinear,
            Some(v) => Filter::from_pillow(v.as_u64().ok_or_else(|| pillow_filter(v))?)?,
        };
        let crop = match (on("do_center_crop", false)?, config.get("crop_size")) {
            (true, Some(size)) => match hugging_face_size(size, "crop_size", false)? {
                Resize::Exact(w, h) => Some((w, h)),
                Resize::ShortestEdge(s) => Some((s, s)),
            },
            (true, None) => return Err(BadSpec::CropWithoutSize),
            (false, _) => None,
        };
        let scale = match on("do_rescale", true)? {
            true => number(config.get("rescale_factor"), "rescale_factor")?.unwrap_or(1.0 / 255.0),
            false => 1.0,
        };
        let (mean, std) = match on("do_normalize", true)? {
            true => (
                triple(config.get("image_mean"), "image_mean")?.unwrap_or([0.5; 3]),
                triple(config.get("image_std"), "image_std")?.unwrap_or([0.5; 3]),
            ),
            false => ([0.0; 3], [1.0; 3]),
        };
        let spec = ImageSpec {
            resize,
            filter,
            crop,
            channels: Channels::Rgb,
            layout: Layout::Nchw,
            scale,
            mean,
            std,
            declared_in: "preprocessor_config.json".into(),
        };
        spec.check()
    }

    /// Refuses a preprocessing that would not give every image one size, or a std of 0.
    fn check(self) -> std::result::Result<ImageSpec, BadSpec> {
        if self.output_size().is_none() {
            return Err(BadSpec::NoOneSize);
        }
        if self.std.contains(&0.0) {
            return Err(BadSpec::ZeroStd);
        }
        if let Some((w, h)) = self.output_size()
            && u64::from(w) * u64::from(h) > MAX_PREPARED_PIXELS
        {
            return Err(BadSpec::PreparedTooLarge(w, h));
        }
        if let Some(Resize::Exact(w, h)) = self.resize
            && u64::from(w) * u64::from(h) > MAX_PREPARED_PIXELS * 4
        {
            return Err(BadSpec::ResizeTooLarge(w, h));
        }
        Ok(self)
    }

    /// (width, height) of every prepared image.
    pub fn output_size(&self) -> Option<(u32, u32)> {
        match (self.crop, self.resize) {
            (Some(crop), _) => Some(crop),
            (None, Some(Resize::Exact(w, h))) => Some((w, h)),
            _ => None,
        }
    }

    /// The values of one prepared image: 3 x height x width.
    pub fn values_per_image(&self) -> usize {
        self.output_size()
            .map_or(0, |(w, h)| 3 * w as usize * h as usize)
    }

    /// The shape of one prepared image, in the declared layout.
    pub fn row_shape(&self) -> Vec<i64> {
        let (w, h) = self.output_size().unwrap_or((0, 0));
        match self.layout {
            Layout::Nchw => vec![3, h as i64, w as i64],
            Layout::Nhwc => vec![h as i64, w as i64, 3],
        }
    }

    /// What DESCRIBE MODEL says of it.
    pub fn describe(&self) -> String {
        let mut steps = vec!["decode, EXIF orientation".to_string()];
        match self.resize {
            Some(Resize::Exact(w, h)) => {
                steps.push(format!("resize to {w}x{h} ({:?})", self.filter))
            }
            Some(Resize::ShortestEdge(s)) => steps.push(format!(
                "resize the shorter side to {s} ({:?})",
                self.filter
            )),
            None => {}
        }
        if let Some((w, h)) = self.crop {
            steps.push(format!("centre crop {w}x{h}"));
        }
        steps.push(format!(
            "{:?}, {:?}, (x * {} - mean {:?}) / std {:?}",
            self.channels, self.layout, self.scale, self.mean, self.std
        ));
        format!("{} (from {})", steps.join("; "), self.declared_in)
    }
}

impl Filter {
    fn parse(name: &str) -> std::result::Result<Filter, BadSpec> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "nearest" => Filter::Nearest,
            "bilinear" => Filter::Bilinear,
            "bicubic" => Filter::Bicubic,
            "lanczos" => Filter::Lanczos,
            "box" => Filter::Box,
            "hamming" => Filter::Hamming,
            _ => {
                return Err(expected(
                    "filter",
                    "one of nearest, bilinear, bicubic, lanczos, box, hamming",
                    &Value::from(name),
                ));
            }
        })
    }

    /// Pillow's numbers for its filters (`Image.Resampling`).
    fn from_pillow(n: u64) -> std::result::Result<Filter, BadSpec> {
        Ok(match n {
            0 => Filter::Nearest,
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            _ => {
                return Err(pillow_filter(&Value::from(n)));
            }
        })
    }
}

/// The keys of batchinfer.json's "image".
const BATCHINFER_KEYS: &[&str] = &[
    "resize", "filter", "crop", "channels", "layout", "mean", "std", "scale",
];

/// An image preprocessing declaration that cannot be used, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BadSpec {
    #[error("\"{key}\" is {expected}, not {got}")]
    Expected {
        key: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("an object is expected, as {{\"resize\": [224, 224]}}")]
    NotAnObject,
    #[error("\"{0}\" is not a setting; the settings are {keys}", keys = BATCHINFER_KEYS.join(", "))]
    UnknownKey(String),
    #[error("\"do_center_crop\" without \"crop_size\"")]
    CropWithoutSize,
    #[error(
        "images would keep sizes of their own: give \"resize\" a [width, height] or a \"crop\""
    )]
    NoOneSize,
    #[error("a \"std\" of 0 divides by zero")]
    ZeroStd,
    #[error(
        "images of {0}x{1} pixels are more than a model takes here ({MAX_PREPARED_PIXELS} pixels)"
    )]
    PreparedTooLarge(u32, u32),
    #[error("a resize to {0}x{1} pixels is more than batchinfer makes")]
    ResizeTooLarge(u32, u32),
}

fn expected(key: &'static str, expected: &'static str, got: &Value) -> BadSpec {
    BadSpec::Expected {
        key,
        expected,
        got: got.to_string(),
    }
}

fn pillow_filter(got: &Value) -> BadSpec {
    expected("resample", "one of Pillow's filters (0 to 5)", got)
}

/// A side of at most 16,384 pixels.
fn side(v: &Value, what: &'static str) -> std::result::Result<u32, BadSpec> {
    v.as_u64()
        .filter(|n| (1..=16_384).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| expected(what, "a number of pixels from 1 to 16384", v))
}

/// `[width, height]`.
fn pair(v: &Value, what: &'static str) -> std::result::Result<(u32, u32), BadSpec> {
    match v.as_array().map(Vec::as_slice) {
        Some([w, h]) => Ok((side(w, what)?, side(h, what)?)),
        _ => Err(expected(what, "[width, height]", v)),
    }
}

fn number(v: Option<&Value>, what: &'static str) -> std::result::Result<Option<f32>, BadSpec> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite() && x.abs() < 1e12)
            .map(Some)
            .ok_or_else(|| expected(what, "a number (of at most 1e12)", v)),
    }
}

/// Three numbers, one per channel (one number: the same for each).
fn triple(v: Option<&Value>, what: &'static str) -> std::result::Result<Option<[f32; 3]>, BadSpec> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(values)) if values.len() == 3 => {
            let mut out = [0.0; 3];
            for (o, v) in out.iter_mut().zip(values) {
                *o = number(Some(v), what)?.unwrap_or(0.0);
            }
            Ok(Some(out))
        }
        Some(v) if v.is_number() => Ok(number(Some(v), what)?.map(|x| [x; 3])),
        Some(v) => Err(expected(what, "three numbers, one per channel", v)),
    }
}

/// Hugging Face's `size` (or `crop_size`): `{"height", "width"}`, `{"shortest_edge"}` or one
/// number (a square, or with `shortest` the shorter side as older processors meant it).
fn hugging_face_size(
    v: &Value,
    what: &'static str,
    shortest: bool,
) -> std::result::Result<Resize, BadSpec> {
    if let Some(n) = v.as_u64() {
        let s = side(&Value::from(n), what)?;
        return Ok(match shortest {
            true => Resize::ShortestEdge(s),
            false => Resize::Exact(s, s),
        });
    }
    let get = |k: &str| v.get(k);
    match (get("height"), get("width"), get("shortest_edge")) {
        (Some(h), Some(w), _) => Ok(Resize::Exact(side(w, what)?, side(h, what)?)),
        (_, _, Some(s)) => Ok(Resize::ShortestEdge(side(s, what)?)),
        _ => Err(expected(
            what,
            "{\"height\", \"width\"} or {\"shortest_edge\"}",
            v,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, json: &str) -> Result<Option<ImageSpec>> {
        ImageSpec::from_files(&[(name, json.as_bytes().to_vec())])
    }

    #[test]
    fn batchinfer_json_declares_open_nsfws_preprocessing() {
        let s = spec(
            "batchinfer.json",
            r#"{"image": {"resize": [256, 256], "crop": [224, 224], "channels": "BGR",
                "layout": "NHWC", "mean": [104, 117, 123]}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.resize, Some(Resize::Exact(256, 256)));
        assert_eq!(s.crop, Some((224, 224)));
        assert_eq!((s.channels, s.layout), (Channels::Bgr, Layout::Nhwc));
        assert_eq!(
            (s.scale, s.mean, s.std),
            (1.0, [104.0, 117.0, 123.0], [1.0; 3])
        );
        assert_eq!(s.row_shape(), vec![224, 224, 3]);
    }

    #[test]
    fn hugging_faces_preprocessor_config_is_read_as_transformers_reads_it() {
        let s = spec(
            "preprocessor_config.json",
            r#"{"do_resize": true, "size": {"shortest_edge": 224}, "resample": 3,
                "do_center_crop": true, "crop_size": {"height": 224, "width": 224},
                "do_rescale": true, "rescale_factor": 0.00392156862745098,
                "do_normalize": true, "image_mean": [0.481, 0.457, 0.408],
                "image_std": [0.268, 0.261, 0.275]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.resize, Some(Resize::ShortestEdge(224)));
        assert_eq!(s.filter, Filter::Bicubic);
        assert_eq!(s.row_shape(), vec![3, 224, 224]);
        assert!((s.scale - 1.0 / 255.0).abs() < 1e-9);
    }

    #[test]
    fn mistakes_are_refused_naming_the_setting() {
        let err = |json: &str| spec("batchinfer.json", json).unwrap_err().to_string();
        assert!(err(r#"{"image": {"resize": [224]}}"#).contains("\"resize\" is [width, height]"));
        assert!(
            err(r#"{"image": {"resize": {"shortest_edge": 224}}}"#).contains("sizes of their own")
        );
        assert!(err(r#"{"image": {"resize": [2, 2], "std": [0, 1, 1]}}"#).contains("std"));
        assert!(err(r#"{"image": {"resize": [2, 2], "colour": "RGB"}}"#).contains("\"colour\""));
        assert!(err(r#"{"image": {"resize": [99999, 2]}}"#).contains("1 to 16384"));
        assert!(
            spec("batchinfer.json", r#"{"pooling": "mean"}"#)
                .unwrap()
                .is_none()
        );
        assert!(err(r#"{"image": {"resize": [2, 2], "channels": 5}}"#).contains("channels"));
        assert!(err(r#"{"image": {"resize": [2, 2], "layout": ["NHWC"]}}"#).contains("layout"));
        assert!(err(r#"{"image": {"crop": [16384, 16384]}}"#).contains("more than a model"));
        assert!(err(r#"{"image": {"resize": [2, 2], "std": 1e39}}"#).contains("at most 1e12"));
        let hf = |json: &str| spec("preprocessor_config.json", json);
        let e = hf(r#"{"image_mean": [0.5, 0.5, 0.5], "size": 224, "do_normalize": "false"}"#);
        assert!(e.unwrap_err().to_string().contains("do_normalize"));
        // An audio model's feature extractor is no image preprocessing.
        let audio =
            r#"{"feature_extractor_type": "Wav2Vec2FeatureExtractor", "sampling_rate": 16000}"#;
        assert!(hf(audio).unwrap().is_none());
    }
}
