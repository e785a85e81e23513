//! The arithmetic of quantization, as ONNX Runtime's Python tooling does it
//! (`quant_utils.compute_scale_zp`, `quantize_nparray`): ranges that include 0, computed in f64
//! and kept as f32 scales, values divided in f32 and rounded half to even.

/// Symmetric int8 per output column of `w [k, n]` (row-major): the weights, in [-127, 127], and
/// one scale per column.
pub fn quantize_columns(w: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; n];
    for (j, scale) in scales.iter_mut().enumerate() {
        let absmax = (0..k).map(|r| w[r * n + j].abs()).fold(0f32, f32::max);
        let range = 2.0 * f64::from(absmax) / 254.0;
        *scale = if range < f64::from(f32::MIN_POSITIVE) {
            1.0
        } else {
            range as f32
        };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| (v / scales[i % n]).round_ties_even().clamp(-128.0, 127.0) as i8)
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
            [(4.0f64 / 254.0) as f32, 1.0, (1.0f64 / 254.0) as f32]
        );
        assert_eq!(q, [64, 0, 127, -127, 0, 64]);
        // 63.5 rounds to 64 (half to even); -2 / scale is exactly -127.
        let (q, _) = quantize_columns(&[0.5, 1.0], 2, 1);
        assert_eq!(q, [64, 127]);
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
