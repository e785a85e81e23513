//! What a quantization did: the nodes it rewrote, and why it left the others in float.

use std::collections::BTreeMap;

use super::MIN_INNER;

/// Why a MatMul or Gemm was left in float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Left {
    NotConstant,
    NotFloat32,
    NotMatrix,
    FewRows,
    NotFinite,
    Unusual,
}

impl Left {
    fn text(self) -> String {
        match self {
            Left::NotConstant => "a weight computed by the graph (not a constant)".into(),
            Left::NotFloat32 => "a weight that is not float32".into(),
            Left::NotMatrix => "a weight that is not a matrix (two dimensions)".into(),
            Left::FewRows => format!("a weight of fewer than {MIN_INNER} rows"),
            Left::NotFinite => "a weight with NaN or infinite values".into(),
            Left::Unusual => {
                "an unusual form (a transposed input, missing inputs or outputs)".into()
            }
        }
    }
}

/// What the rewrite did.
#[derive(Debug, Default)]
pub struct Counts {
    pub matmul: usize,
    pub matmul_done: usize,
    pub gemm: usize,
    pub gemm_done: usize,
    pub gather_done: usize,
    pub embed_done: usize,
    pub attention: usize,
    pub attention_done: usize,
    pub left: BTreeMap<Left, usize>,
}

impl Counts {
    /// `18 of 24 MatMul, 3 Gather`.
    pub fn text(&self) -> String {
        let mut parts = Vec::new();
        if self.matmul > 0 {
            parts.push(format!("{} of {} MatMul", self.matmul_done, self.matmul));
        }
        if self.gemm > 0 {
            parts.push(format!("{} of {} Gemm", self.gemm_done, self.gemm));
        }
        if self.attention > 0 {
            parts.push(format!(
                "{} of {} Attention",
                self.attention_done, self.attention
            ));
        }
        if self.gather_done > 0 {
            parts.push(format!("{} Gather", self.gather_done));
        }
        if self.embed_done > 0 {
            parts.push(format!("{} EmbedLayerNormalization", self.embed_done));
        }
        parts.join(", ")
    }

    /// Why nothing was quantized.
    pub fn why_none(&self) -> String {
        if self.matmul + self.gemm + self.attention == 0 {
            let tables = if self.gather_done + self.embed_done > 0 {
                "; its embedding tables alone would make it smaller, not faster"
            } else {
                ""
            };
            return format!(
                "it has no MatMul, Gemm or Attention node (int8 quantization speeds up those){tables}"
            );
        }
        let reasons: Vec<String> = self
            .left
            .iter()
            .map(|(why, n)| format!("{n} read {}", why.text()))
            .collect();
        format!(
            "of its {} MatMul, {} Gemm and {} Attention node(s), {}",
            self.matmul,
            self.gemm,
            self.attention,
            reasons.join(", ")
        )
    }
}
