//! Pillow's resampling (`Image.resize` with a filter): its kernels and supports, its
//! fixed-point weights and rounding, a horizontal pass then a vertical one.

use ::image::RgbImage;

use super::Filter;

/// Pillow's fixed-point precision for 8-bit images (`PRECISION_BITS` of its Resample.c).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A filter's kernel and support, as Pillow defines them.
fn kernel(filter: Filter) -> (fn(f64) -> f64, f64) {
    fn sinc(x: f64) -> f64 {
        if x == 0.0 {
            return 1.0;
        }
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
    match filter {
        Filter::Box => (|x| if x > -0.5 && x <= 0.5 { 1.0 } else { 0.0 }, 0.5),
        Filter::Bilinear => (
            |x| {
                let x = x.abs();
                if x < 1.0 { 1.0 - x } else { 0.0 }
            },
            1.0,
        ),
        Filter::Hamming => (
            |x| {
                let x = x.abs();
                if x == 0.0 {
                    return 1.0;
                }
                if x >= 1.0 {
                    return 0.0;
                }
                let x = x * std::f64::consts::PI;
                x.sin() / x * (0.54 + 0.46 * x.cos())
            },
            1.0,
        ),
        Filter::Bicubic => (
            |x| {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            },
            2.0,
        ),
        Filter::Lanczos | Filter::Nearest => (
            |x| {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            },
            3.0,
        ),
    }
}

/// For each of `out` output pixels, the first input pixel it reads, how many, and their
/// weights in Pillow's fixed point (`precompute_coeffs` and `normalize_coeffs_8bpc`).
fn coefficients(size: u32, out: u32, filter: Filter) -> (Vec<(usize, usize)>, Vec<Vec<i32>>) {
    let (kernel, support) = kernel(filter);
    let scale = f64::from(size) / f64::from(out);
    let filterscale = scale.max(1.0);
    let support = support * filterscale;
    let mut bounds = Vec::with_capacity(out as usize);
    let mut weights = Vec::with_capacity(out as usize);
    for xx in 0..out {
        let center = (f64::from(xx) + 0.5) * scale;
        let ss = 1.0 / filterscale;
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(i64::from(size)) - xmin;
        let xmax = xmax.max(0);
        let mut k: Vec<f64> = (0..xmax)
            .map(|x| kernel((x as f64 + xmin as f64 - center + 0.5) * ss))
            .collect();
        let ww: f64 = k.iter().sum();
        if ww != 0.0 {
            for w in &mut k {
                *w /= ww;
            }
        }
        let fixed = k
            .iter()
            .map(|&w| {
                let w = w * f64::from(1u32 << PRECISION_BITS);
                if w < 0.0 {
                    (w - 0.5) as i32
                } else {
                    (w + 0.5) as i32
                }
            })
            .collect();
        bounds.push((xmin as usize, xmax as usize));
        weights.push(fixed);
    }
    (bounds, weights)
}

/// A fixed-point sum as Pillow clips it to a byte.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `image` resized to `w` x `h` with `filter` as Pillow's `Image.resize` does it: a horizontal
/// pass into an 8-bit image, then a vertical one, each with Pillow's weights and rounding.
pub(super) fn resample(image: &RgbImage, w: u32, h: u32, filter: Filter) -> RgbImage {
    let (iw, ih) = image.dimensions();
    let source = image.as_raw();
    let (xbounds, xweights) = coefficients(iw, w, filter);
    let (ybounds, yweights) = coefficients(ih, h, filter);
    let half = 1i64 << (PRECISION_BITS - 1);
    // The rows the vertical pass reads.
    let first = ybounds.first().map_or(0, |b| b.0);
    let last = ybounds.last().map_or(0, |b| b.0 + b.1);
    let horizontal = w != iw;
    let (rows, row_width, temp);
    if horizontal {
        let mut t = vec![0u8; (last - first) * w as usize * 3];
        for (ty, y) in (first..last).enumerate() {
            let row = &source[y * iw as usize * 3..(y + 1) * iw as usize * 3];
            for (xx, ((xmin, count), k)) in xbounds.iter().zip(&xweights).enumerate() {
                for c in 0..3 {
                    let mut sum = half;
                    for (i, weight) in k.iter().take(*count).enumerate() {
                        sum += i64::from(row[(xmin + i) * 3 + c]) * i64::from(*weight);
                    }
                    t[(ty * w as usize + xx) * 3 + c] = clip8(sum);
                }
            }
        }
        temp = t;
        rows = &temp[..];
        row_width = w as usize;
    } else {
        rows = &source[first * iw as usize * 3..last * iw as usize * 3];
        row_width = iw as usize;
    }
    if h == ih {
        return RgbImage::from_raw(w, h, rows.to_vec()).unwrap_or_default();
    }
    let mut out = vec![0u8; w as usize * h as usize * 3];
    for (yy, ((ymin, count), k)) in ybounds.iter().zip(&yweights).enumerate() {
        let ymin = ymin - first;
        for x in 0..row_width {
            for c in 0..3 {
                let mut sum = half;
                for (i, weight) in k.iter().take(*count).enumerate() {
                    sum +=
                        i64::from(rows[((ymin + i) * row_width + x) * 3 + c]) * i64::from(*weight);
                }
                out[(yy * row_width + x) * 3 + c] = clip8(sum);
            }
        }
    }
    RgbImage::from_raw(w, h, out).unwrap_or_default()
}
