//! One image's bytes to the values a model takes: decoded (JPEG, PNG, WebP, GIF's first frame,
//! BMP, TIFF), turned as its EXIF orientation says, made RGB, resized as Pillow's
//! `Image.resize` resizes (its filters, weights, fixed-point rounding and passes), centre-cropped,
//! and normalized into the declared layout. Every failure is a message for the image's row.

use std::io::Cursor;
use std::sync::Arc;

use ::image::{DynamicImage, ImageDecoder, ImageReader, Limits, RgbImage};

use super::resample::resample;
use super::{Channels, Filter, ImageSpec, Layout, Resize};

/// The most pixels an image may have: Pillow's limit (`Image.MAX_IMAGE_PIXELS`, twice of which
/// it refuses). A larger one (a decompression bomb: a few KB that decode to gigabytes) is
/// refused from its header, before anything is allocated for it.
pub const MAX_PIXELS: u64 = 178_956_970;

/// The most memory a decoder may take for one image.
const MAX_ALLOC: u64 = 1 << 30;

/// The most memory the images being decoded at once may take, in all: an image waits for room
/// (one larger than this is decoded alone), so that decoding on every core of every partition
/// stays bounded.
const DECODING_AT_ONCE: u64 = 2 << 30;

/// The bytes images being decoded take now.
/// Per process: the machine's memory is shared by every statement.
static DECODING: (parking_lot::Mutex<u64>, parking_lot::Condvar) =
    (parking_lot::Mutex::new(0), parking_lot::Condvar::new());

/// Room for an image of `bytes` decoded, held until dropped.
struct Room(u64);

impl Room {
    fn take(bytes: u64) -> Room {
        let (used, freed) = &DECODING;
        let mut now = used.lock();
        while *now > 0 && now.saturating_add(bytes) > DECODING_AT_ONCE {
            freed.wait(&mut now);
        }
        *now = now.saturating_add(bytes);
        Room(bytes)
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let (used, freed) = &DECODING;
        let mut now = used.lock();
        *now = now.saturating_sub(self.0);
        freed.notify_all();
    }
}

/// The largest image a resize may make (before its crop): a very long, thin image resized by
/// its shorter side would otherwise grow without bound.
const MAX_RESIZED_PIXELS: u64 = 1 << 26;

/// Why an image could not be read, or prepared for a model.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    #[error("an empty file is not an image")]
    EmptyFile,
    #[error("not an image batchinfer reads (JPEG, PNG, WebP, GIF, BMP, TIFF); it begins {0}")]
    NotAnImage(String),
    #[error("a truncated JPEG: no end marker follows its last scan (a file cut short?)")]
    TruncatedJpeg,
    #[error("an image of {width}x{height} pixels has nothing to see")]
    NoPixels { width: u32, height: u32 },
    #[error(
        "an image of {width}x{height} pixels ({pixels}) is more than {MAX_PIXELS} pixels (a \
         decompression bomb?)"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
    },
    #[error(
        "an image of {width}x{height} pixels ({color}) takes {bytes} bytes decoded, more than \
         {MAX_ALLOC}"
    )]
    TooLargeDecoded {
        width: u32,
        height: u32,
        color: String,
        bytes: u64,
    },
    #[error(
        "an image of {width}x{height} pixels would be resized to {w}x{h}, more than \
         {MAX_RESIZED_PIXELS} pixels"
    )]
    ResizedTooLarge {
        width: u32,
        height: u32,
        w: u64,
        h: u64,
    },
    #[error("no size is declared")]
    NoSize,
    /// What the image crate's decoder says.
    #[error("{0}")]
    Decoder(Arc<::image::ImageError>),
    #[error("the image decoder failed on it (a panic)")]
    Panicked,
}

fn decoder_error(e: ::image::ImageError) -> Unreadable {
    Unreadable::Decoder(Arc::new(e))
}

/// Decodes `bytes` into an RGB image, upright.
pub fn decode(bytes: &[u8]) -> Result<RgbImage, Unreadable> {
    if bytes.is_empty() {
        return Err(Unreadable::EmptyFile);
    }
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Unreadable::Decoder(Arc::new(e.into())))?;
    match reader.format() {
        None => return Err(Unreadable::NotAnImage(begins(bytes))),
        // The JPEG decoder makes the most of a cut file (grey where bytes are missing), as
        // Pillow does not by default: a file cut short (no end marker after its first scan) is
        // refused here.
        Some(::image::ImageFormat::Jpeg) if !jpeg_is_whole(bytes) => {
            return Err(Unreadable::TruncatedJpeg);
        }
        Some(_) => {}
    }
    // The size is checked here first, so that a bomb is refused in these words.
    reader.limits(Limits::no_limits());
    let mut decoder = reader.into_decoder().map_err(decoder_error)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(Unreadable::NoPixels { width, height });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > MAX_PIXELS {
        return Err(Unreadable::TooManyPixels {
            width,
            height,
            pixels,
        });
    }
    if decoder.total_bytes() > MAX_ALLOC {
        return Err(Unreadable::TooLargeDecoded {
            width,
            height,
            color: format!("{:?}", decoder.color_type()),
            bytes: decoder.total_bytes(),
        });
    }
    // As decoded, and again as RGB.
    let bytes = decoder
        .total_bytes()
        .saturating_add(pixels.saturating_mul(3));
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_ALLOC);
    decoder.set_limits(limits).map_err(decoder_error)?;
    let _room = Room::take(bytes);
    let orientation = decoder.orientation().ok();
    let mut image = DynamicImage::from_decoder(decoder).map_err(decoder_error)?;
    if let Some(orientation) = orientation {
        image.apply_orientation(orientation);
    }
    Ok(to_rgb(image))
}

/// An image as 8-bit RGB, as Pillow's `convert("RGB")` makes it: 16-bit grey values above 255
/// are 255 (Pillow clips them; other 16-bit images are scaled to 8 bits, as Pillow reads them).
fn to_rgb(image: DynamicImage) -> RgbImage {
    let grey = |w: u32, h: u32, at: &dyn Fn(u32, u32) -> u16| {
        RgbImage::from_fn(w, h, |x, y| {
            let v = at(x, y).min(255) as u8;
            ::image::Rgb([v, v, v])
        })
    };
    match image {
        DynamicImage::ImageLuma16(g) => grey(g.width(), g.height(), &|x, y| g.get_pixel(x, y).0[0]),
        DynamicImage::ImageLumaA16(g) => {
            grey(g.width(), g.height(), &|x, y| g.get_pixel(x, y).0[0])
        }
        image => image.into_rgb8(),
    }
}

/// Whether a JPEG's scans are followed by an end-of-image marker (`FF D9`): inside a scan an
/// `FF` byte is always followed by `00` or a restart marker, so the end marker appears only
/// where the image ends (data a camera appends after it is allowed).
fn jpeg_is_whole(bytes: &[u8]) -> bool {
    match first_scan(bytes) {
        Some(at) => bytes[at..].windows(2).any(|w| w == [0xFF, 0xD9]),
        // Segments that cannot be walked: the decoder says what is wrong.
        None => true,
    }
}

/// Where a JPEG's first scan begins, found by walking its segments from the start (a thumbnail
/// inside an APP1 segment is stepped over whole).
fn first_scan(bytes: &[u8]) -> Option<usize> {
    let mut i = 2;
    loop {
        while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        if bytes.get(i) != Some(&0xFF) {
            return None;
        }
        match *bytes.get(i + 1)? {
            0xDA => return Some(i),
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let len = u16::from_be_bytes([*bytes.get(i + 2)?, *bytes.get(i + 3)?]);
                i += 2 + usize::from(len);
            }
        }
    }
}

/// The first bytes of a file, as a person can read them in a message.
fn begins(bytes: &[u8]) -> String {
    let head: String = bytes[..bytes.len().min(8)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!("with bytes {head}")
}

/// Writes the values of `bytes` prepared as `spec` says into `out` (3 x height x width).
pub fn prepare(bytes: &[u8], spec: &ImageSpec, out: &mut [f32]) -> Result<(), Unreadable> {
    let image = decode(bytes)?;
    let image = resize(image, spec)?;
    let (width, height) = spec.output_size().ok_or(Unreadable::NoSize)?;
    normalize(&image, width, height, spec, out);
    Ok(())
}

/// The size `resize` makes of an image of `width` x `height` (Hugging Face's arithmetic for
/// the shorter side: the longer one in proportion, cut to a whole pixel).
fn resized_size(resize: Resize, width: u32, height: u32) -> Result<(u32, u32), Unreadable> {
    let (w, h) = match resize {
        Resize::Exact(w, h) => (u64::from(w), u64::from(h)),
        Resize::ShortestEdge(s) => {
            let (short, long) = (u64::from(width.min(height)), u64::from(width.max(height)));
            let long = ((u64::from(s) * long) / short.max(1)).max(1);
            match width <= height {
                true => (u64::from(s), long),
                false => (long, u64::from(s)),
            }
        }
    };
    if w.saturating_mul(h) > MAX_RESIZED_PIXELS {
        return Err(Unreadable::ResizedTooLarge {
            width,
            height,
            w,
            h,
        });
    }
    Ok((w as u32, h as u32))
}

fn resize(image: RgbImage, spec: &ImageSpec) -> Result<RgbImage, Unreadable> {
    let Some(resize) = spec.resize else {
        return Ok(image);
    };
    let (width, height) = image.dimensions();
    let (w, h) = resized_size(resize, width, height)?;
    if (w, h) == (width, height) {
        return Ok(image);
    }
    Ok(match spec.filter {
        Filter::Nearest => nearest(&image, w, h),
        filter => resample(&image, w, h, filter),
    })
}

/// `image` resized to `w` x `h` by Pillow's nearest neighbour: each pixel takes the source
/// pixel under its centre, the centres stepped through as Pillow steps them (a sum of the
/// scale, in doubles), so that a centre on a pixel's edge falls where Pillow's does.
fn nearest(image: &RgbImage, w: u32, h: u32) -> RgbImage {
    let (iw, ih) = image.dimensions();
    let centres = |out: u32, size: u32| -> Vec<u32> {
        let scale = f64::from(size) / f64::from(out);
        let mut at = scale * 0.5;
        (0..out)
            .map(|_| {
                let from = (at.max(0.0) as u32).min(size - 1);
                at += scale;
                from
            })
            .collect()
    };
    let (xs, ys) = (centres(w, iw), centres(h, ih));
    RgbImage::from_fn(w, h, |x, y| {
        *image.get_pixel(xs[x as usize], ys[y as usize])
    })
}

/// The centre `width` x `height` of `image` (zeros where it is smaller, as Hugging Face pads),
/// normalized into `out` in the declared channel order and layout.
fn normalize(image: &RgbImage, width: u32, height: u32, spec: &ImageSpec, out: &mut [f32]) {
    let (iw, ih) = image.dimensions();
    // As Hugging Face's center_crop and Pillow's crop of the centre place it.
    let left = (i64::from(iw) - i64::from(width)).div_euclid(2);
    let top = (i64::from(ih) - i64::from(height)).div_euclid(2);
    let order: [usize; 3] = match spec.channels {
        Channels::Rgb => [0, 1, 2],
        Channels::Bgr => [2, 1, 0],
    };
    let (w, h) = (width as usize, height as usize);
    for y in 0..h {
        for x in 0..w {
            let (sx, sy) = (left + x as i64, top + y as i64);
            let pixel = (sx >= 0 && sy >= 0 && sx < i64::from(iw) && sy < i64::from(ih))
                .then(|| image.get_pixel(sx as u32, sy as u32).0);
            for (c, &from) in order.iter().enumerate() {
                let raw = pixel.map_or(0.0, |p| f32::from(p[from]));
                let value = (raw * spec.scale - spec.mean[c]) / spec.std[c];
                let at = match spec.layout {
                    Layout::Nchw => (c * h + y) * w + x,
                    Layout::Nhwc => (y * w + x) * 3 + c,
                };
                out[at] = value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
        let image = RgbImage::from_fn(width, height, |x, y| ::image::Rgb(pixel(x, y)));
        let mut bytes = Vec::new();
        DynamicImage::ImageRgb8(image)
            .write_to(&mut Cursor::new(&mut bytes), ::image::ImageFormat::Png)
            .unwrap();
        bytes
    }

    fn spec(json: &str) -> ImageSpec {
        ImageSpec::from_files(&[("batchinfer.json", json.as_bytes().to_vec())])
            .unwrap()
            .unwrap()
    }

    #[test]
    fn channels_layout_and_normalization_are_as_declared() {
        // A 2x1 image: red, then blue.
        let bytes = png(2, 1, |x, _| if x == 0 { [255, 0, 0] } else { [0, 0, 255] });
        let mut out = vec![0.0; 6];
        let s = spec(
            r#"{"image": {"resize": [2, 1], "layout": "NCHW", "scale": 0.5, "mean": [1, 2, 3], "std": [2, 2, 2]}}"#,
        );
        prepare(&bytes, &s, &mut out).unwrap();
        // Planes R, G, B; (x * 0.5 - mean) / 2.
        assert_eq!(out, vec![63.25, -0.5, -1.0, -1.0, -1.5, 62.25]);
        let s = spec(r#"{"image": {"resize": [2, 1], "layout": "NHWC", "channels": "BGR"}}"#);
        prepare(&bytes, &s, &mut out).unwrap();
        assert_eq!(out, vec![0.0, 0.0, 255.0, 255.0, 0.0, 0.0]);
    }

    #[test]
    fn the_centre_is_cropped_and_a_small_image_padded() {
        let bytes = png(4, 4, |x, y| [(x * 10 + y) as u8, 0, 0]);
        let mut out = vec![0.0; 12];
        let s = spec(r#"{"image": {"crop": [2, 2]}}"#);
        prepare(&bytes, &s, &mut out).unwrap();
        assert_eq!(&out[..4], &[11.0, 21.0, 12.0, 22.0]);
        let bytes = png(1, 1, |_, _| [9, 9, 9]);
        let s = spec(r#"{"image": {"crop": [3, 1]}}"#);
        let mut out = vec![0.0; 9];
        prepare(&bytes, &s, &mut out).unwrap();
        assert_eq!(&out[..3], &[0.0, 9.0, 0.0]);
        // An odd pad goes first on the left, as Hugging Face's center_crop puts it.
        let s = spec(r#"{"image": {"crop": [2, 1]}}"#);
        let mut out = vec![0.0; 6];
        prepare(&bytes, &s, &mut out).unwrap();
        assert_eq!(&out[..2], &[0.0, 9.0]);
    }

    #[test]
    fn bad_files_are_messages_never_panics() {
        let s = spec(r#"{"image": {"resize": [8, 8]}}"#);
        let mut out = vec![0.0; 3 * 64];
        let good = png(16, 16, |x, y| [x as u8, y as u8, 7]);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("text", b"just some text, named .png".to_vec()),
            ("truncated", good[..good.len() / 2].to_vec()),
            ("header only", good[..40].to_vec()),
        ];
        for (what, bytes) in cases {
            let e = prepare(&bytes, &s, &mut out).expect_err(what);
            assert!(!e.to_string().is_empty(), "{what}");
        }
        prepare(&good, &s, &mut out).unwrap();
    }

    #[test]
    fn a_decompression_bomb_is_refused_from_its_header() {
        // A PNG header claiming 50,000 x 50,000 pixels, with a tiny IDAT.
        let mut bytes = png(1, 1, |_, _| [0, 0, 0]);
        // IHDR's width and height follow the signature (8), length (4) and type (4).
        bytes[16..20].copy_from_slice(&50_000u32.to_be_bytes());
        bytes[20..24].copy_from_slice(&50_000u32.to_be_bytes());
        // The IHDR's CRC no longer matches; PNG decoders check it, so fix it.
        let crc = crc32(&bytes[12..29]);
        bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        let e = decode(&bytes).unwrap_err().to_string();
        assert!(
            e.contains("50000x50000") && e.contains("decompression bomb"),
            "{e}"
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
    fn the_shorter_side_is_resized_as_hugging_face_does() {
        let size = |resize, w, h| resized_size(resize, w, h).ok();
        assert_eq!(size(Resize::ShortestEdge(224), 640, 480), Some((298, 224)));
        assert_eq!(size(Resize::ShortestEdge(224), 480, 640), Some((224, 298)));
        assert_eq!(size(Resize::Exact(5, 7), 1, 1), Some((5, 7)));
        // A long, thin image is refused, never resized to gigabytes (nor wrapped to 0).
        let e = resized_size(Resize::ShortestEdge(16384), 1, 262_144)
            .unwrap_err()
            .to_string();
        assert!(e.contains("16384x4294967296"), "{e}");
        assert!(resized_size(Resize::ShortestEdge(224), 1, 100_000).is_err());
    }
}
