//! The rewrite of Gather and EmbedLayerNormalization nodes: their tables quantized.

use super::*;

impl Rewrite {
    /// The constant float tensor `name` as uint8 (a table: one scale and zero point), once.
    fn table(&mut self, graph: &GraphProto, name: &str) -> Option<Weight> {
        let key = Key::Table(name.to_string());
        if let Some(found) = self.weights.get(&key) {
            return Some(found.clone());
        }
        let float = self.constant(graph, name)?;
        let dims = float.dims.clone();
        let values = floats(float).ok()?;
        let (q, scale, zero) = quantize_table(&values);
        let weight = Weight {
            values: self.name(&format!("{name}_quantized")),
            scales: self.name(&format!("{name}_scale")),
            zeros: self.name(&format!("{name}_zero_point")),
        };
        self.initializers
            .push(tensor(&weight.values, DataType::Uint8, &dims, q));
        self.initializers.push(tensor(
            &weight.scales,
            DataType::Float,
            &[],
            f32_bytes(&[scale]),
        ));
        self.initializers
            .push(tensor(&weight.zeros, DataType::Uint8, &[], vec![zero]));
        self.weights.insert(key, weight.clone());
        self.replaced.insert(name.to_string());
        Some(weight)
    }

    pub(super) fn gather(&mut self, gather: &NodeProto, graph: &GraphProto) -> bool {
        let ([table, indices], Some(output)) = (&gather.input[..], gather.output.first()) else {
            return false;
        };
        let Some(weight) = self.table(graph, table) else {
            return false;
        };
        let quantized = self.name(&format!("{output}_quantized"));
        let mut new = gather.clone();
        new.input = vec![weight.values.clone(), indices.clone()];
        new.output = vec![quantized.clone()];
        self.nodes.push(new);
        let name = self.name(&format!("{output}_DequantizeLinear"));
        self.nodes.push(node(
            "DequantizeLinear",
            &name,
            &[&quantized, &weight.scales, &weight.zeros],
            &[output],
        ));
        true
    }

    /// ONNX Runtime's fused embedding layer (`com.microsoft` `EmbedLayerNormalization`: token,
    /// segment and position tables, then LayerNormalization) as its `QEmbedLayerNormalization`,
    /// every table and the normalization's gamma and beta in uint8, as the Python quantizer
    /// writes it. One with position ids or a mask index type given stays float.
    pub(super) fn embed_layer_norm(&mut self, embed: &NodeProto, graph: &GraphProto) -> bool {
        let input = |i: usize| embed.input.get(i).cloned().unwrap_or_default();
        let known = embed
            .attribute
            .iter()
            .all(|a| a.name.as_deref() == Some("epsilon"));
        // QEmbedLayerNormalization has no `embedding_sum` output.
        if embed.input.len() < 7 || embed.input.len() > 8 || embed.output.len() > 2 || !known {
            return false;
        }
        let segments = !input(4).is_empty();
        // Word, position, gamma and beta must be constants; the segment table when given.
        let names = [input(2), input(3), input(5), input(6)];
        let usable = |n: &String| self.constant(graph, n).is_some_and(|t| floats(t).is_ok());
        if !names.iter().all(usable) || (segments && !usable(&input(4))) {
            return false;
        }
        let mut tables = Vec::new();
        for (i, name) in [2, 3, 4, 5, 6].into_iter().map(|i| (i, input(i))) {
            if i == 4 && !segments {
                tables.push(None);
                continue;
            }
            match self.table(graph, &name) {
                Some(table) => tables.push(Some(table)),
                None => return false,
            }
        }
        let part = |f: fn(&Weight) -> &String| -> Vec<String> {
            tables
                .iter()
                .map(|t| t.as_ref().map(|t| f(t).clone()).unwrap_or_default())
                .collect()
        };
        let mut quantized = embed.clone();
        quantized.op_type = Some("QEmbedLayerNormalization".to_string());
        let base = embed
            .name
            .clone()
            .unwrap_or_else(|| "EmbedLayerNormalization".into());
        quantized.name = Some(self.name(&format!("{base}_quant")));
        quantized.input = [input(0), input(1)]
            .into_iter()
            .chain(part(|t| &t.values))
            .chain([input(7)])
            .chain(part(|t| &t.scales))
            .chain(part(|t| &t.zeros))
            .collect();
        self.nodes.push(quantized);
        true
    }
}
