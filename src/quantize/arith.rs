//! The arithmetic of quantization, as ONNX Runtime's Python tooling does it
//! (`quant_utils.compute_scale_zp`, `quantize_nparray`): ranges that include 0, computed in f64
//! and kept as f32 scales, values divided in f32 and rounded half to even.

/// The range of a quantized weight (ONNX Runtime's int8 range with `reduce_range`).
const WEIGHT_MIN: i16 = -64;
const WEIGHT_MAX: i16 = 64;

/// Symmetric int8 per output column of `w [k, n]` (row-major) in 7 bits, as ONNX Runtime's
/// `quantize_dynamic(reduce_range=True)` does: the weights, in [-64, 64], and one scale per
/// column. With 8 bits, x86 CPUs without VNNI (AVX2, AVX-512F) saturate: ONNX Runtime's
/// uint8 x int8 kernel adds pairs of products in 16 bits (`vpmaddubsw`), and 2 x 255 x 127 does
/// not fit; 2 x 255 x 64 does, so that no CPU rounds a sum away.
pub fn quantize_columns(w: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; n];
    for (j, scale) in scales.iter_mut().enumerate() {
        let absmax = (0..k).map(|r| w[r * n + j].abs()).fold(0f32, f32::max);
        let range = 2.0 * f64::from(absmax) / f64::from(WEIGHT_MAX - WEIGHT_MIN);
        *scale = if range < f64::from(f32::MIN_POSITIVE) {
            1.0
        } else {
            range as f32
        };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            (v / scales[i % n])
                .round_ties_even()
                .clamp(f32::from(WEIGHT_MIN), f32::from(WEIGHT_MAX)) as i8
        })
        .collect();
    (q, scales)
}

/// Asymmetric uint8 over the whole tensor (an embedding table): the values, the scale and the
/// zero point, as ONNX Runtime computes them for its uint8 activation type.
pub fn quantize_table(values: &[f32]) -> (Vec<u8>, f32, u8) {
    let rmin = values.iter().copied().fold(0f32, f32::min);
    let rmax = values.iter().copied().fold(0f32, f32::max);
    let range = (f64::from(rmax) - f64::from(rmin)) / 255.0;
    let (scale, zero) = if range < f64::from(f32::MIN_POSITIVE) {
        (1f32, 0u8)
    } else {
        let zero = (0.0 - f64::from(rmin) / range)
            .round_ties_even()
            .clamp(0.0, 255.0);
        (range as f32, zero as u8)
    };
    let q = values
        .iter()
        .map(|&v| ((v / scale).round_ties_even() + f32::from(zero)).clamp(0.0, 255.0) as u8)
        .collect();
    (q, scale, zero)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_take_onnx_runtimes_scales_and_rounding() {
        // k = 2, n = 3: column 0 [1, -2], column 1 [0, 0], column 2 [0.5, 0.25].
        let w = [1.0, 0.0, 0.5, -2.0, 0.0, 0.25];
        let (q, scales) = quantize_columns(&w, 2, 3);
        assert_eq!(
            scales,
            [(4.0f64 / 128.0) as f32, 1.0, (1.0f64 / 128.0) as f32]
        );
        assert_eq!(q, [32, 0, 64, -64, 0, 32]);
        // 32.5 rounds to 32 and 31.5 to 32 (half to even).
        let (q, _) = quantize_columns(&[0.5078125, 1.0], 2, 1);
        assert_eq!(q, [32, 64]);
        let (q, _) = quantize_columns(&[0.4921875, 1.0], 2, 1);
        assert_eq!(q, [32, 64]);
    }

    #[test]
    fn a_table_takes_a_zero_point_that_represents_zero() {
        let (q, scale, zero) = quantize_table(&[-1.0, 0.0, 3.0]);
        assert_eq!(scale, (4.0f64 / 255.0) as f32);
        assert_eq!(zero, 64);
        assert_eq!(q, [0, 64, 255]);
        // All positive: the range still includes 0.
        let (_, _, zero) = quantize_table(&[1.0, 2.0]);
        assert_eq!(zero, 0);
    }
}
