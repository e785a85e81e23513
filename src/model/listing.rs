//! Models as tables: `SHOW MODELS`, `DESCRIBE MODEL name`, and the `models()` table function.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::{Model, ModelRegistry};
use crate::error::Result;

fn join(specs: &[super::TensorSpec]) -> String {
    specs
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// One row of SHOW MODELS: name, source, inputs, outputs, size, sha256, quantization.
type ModelRow = (
    String,
    String,
    String,
    String,
    Option<u64>,
    Option<String>,
    Option<String>,
);

/// One row per registered model: name, source, inputs, outputs, size, sha256, and for a
/// quantized model what it was quantized from, each read from its file without loading it
/// ([`ModelRegistry::listing`]); for a model the warehouse keeps versions of, the version its
/// name picks and the model's aliases (source: where that version was registered from).
pub fn models_batch(registry: &ModelRegistry) -> Result<RecordBatch> {
    let names = registry.names();
    let picks: Vec<Option<super::Picked>> = names.iter().map(|n| registry.picked(n)).collect();
    let mut rows: Vec<ModelRow> = Vec::new();
    for name in names {
        if let Some(model) = registry.endpoint_model(&name) {
            rows.push((
                name,
                model.endpoint.endpoint.clone(),
                "prompt (text)".to_string(),
                format!(
                    "text, or the columns given (endpoint model '{}')",
                    model.endpoint.model
                ),
                None,
                Some(model.sha256.clone()),
                None,
            ));
            continue;
        }
        let source = match registry.picked(&name) {
            Some(picked) => picked.origin,
            None => registry
                .source(&name)
                .map(|s| s.to_string())
                .unwrap_or_default(),
        };
        match registry.listing(&name) {
            Ok(model) => rows.push((
                name,
                source,
                join(&model.inputs),
                join(&model.outputs),
                Some(model.size_bytes as u64),
                Some(model.sha256),
                model.quantized,
            )),
            Err(e) => rows.push((
                name,
                source,
                format!("(not loadable: {e})"),
                String::new(),
                None,
                None,
                None,
            )),
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("inputs", DataType::Utf8, false),
        Field::new("outputs", DataType::Utf8, false),
        Field::new("size_bytes", DataType::UInt64, true),
        Field::new("sha256", DataType::Utf8, true),
        Field::new("quantized", DataType::Utf8, true),
        Field::new("version", DataType::UInt32, true),
        Field::new("aliases", DataType::Utf8, true),
    ]));
    let aliases = picks.iter().map(|p| {
        let p = p.as_ref()?;
        let aliases: Vec<String> = p
            .aliases
            .iter()
            .map(|(a, v)| format!("{a} -> {v}"))
            .collect();
        (!aliases.is_empty()).then(|| aliases.join(", "))
    });
    let column = |f: &dyn Fn(&ModelRow) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        column(&|r| r.0.clone()),
        column(&|r| r.1.clone()),
        column(&|r| r.2.clone()),
        column(&|r| r.3.clone()),
        Arc::new(rows.iter().map(|r| r.4).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.5.clone()).collect::<StringArray>()),
        Arc::new(rows.iter().map(|r| r.6.clone()).collect::<StringArray>()),
        Arc::new(
            picks
                .iter()
                .map(|p| p.as_ref().map(|p| p.version))
                .collect::<UInt32Array>(),
        ),
        Arc::new(aliases.collect::<StringArray>()),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// SHOW MODEL VERSIONS: one row per version of model `name`, oldest first: its number, sha256
/// (and that of the files beside it, where it has any), where it was registered from, when, the aliases naming it, whether the name alone picks it,
/// and where its files are kept.
pub fn versions_batch(name: &str, versions: &super::versions::Versions) -> Result<RecordBatch> {
    let picked = versions
        .resolve(name, &super::versions::Pick::Default)
        .ok()
        .map(|v| v.version);
    let list = &versions.versions;
    let aliases = list.iter().map(|v| {
        let aliases = versions.aliases_of(v.version);
        (!aliases.is_empty()).then(|| aliases.join(", "))
    });
    let schema = Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt32, false),
        Field::new("sha256", DataType::Utf8, true),
        Field::new("beside_sha256", DataType::Utf8, true),
        Field::new("source", DataType::Utf8, false),
        Field::new("created", DataType::Utf8, false),
        Field::new("aliases", DataType::Utf8, true),
        Field::new("picked", DataType::Boolean, false),
        Field::new("kept", DataType::Utf8, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(
            list.iter()
                .map(|v| Some(v.version))
                .collect::<UInt32Array>(),
        ),
        Arc::new(
            list.iter()
                .map(|v| v.sha256.clone())
                .collect::<StringArray>(),
        ),
        Arc::new(
            list.iter()
                .map(|v| v.beside_sha256.clone())
                .collect::<StringArray>(),
        ),
        Arc::new(StringArray::from_iter_values(
            list.iter().map(|v| &v.origin),
        )),
        Arc::new(StringArray::from_iter_values(
            list.iter().map(|v| &v.created),
        )),
        Arc::new(aliases.collect::<StringArray>()),
        Arc::new(
            list.iter()
                .map(|v| Some(Some(v.version) == picked))
                .collect::<BooleanArray>(),
        ),
        Arc::new(StringArray::from_iter_values(
            list.iter().map(|v| &v.source),
        )),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Each input and output of a model with its element type and shape, and a text model's settings.
pub fn describe_batch(model: &Model) -> Result<RecordBatch> {
    let mut rows = tensor_rows(model);
    rows.extend(about_rows(model));
    if let Some(q) = &model.quantized {
        for (name, value) in [
            ("method", &q.method),
            ("from sha256", &q.from_sha256),
            ("nodes", &q.nodes),
        ] {
            rows.push(setting("quantized", name, value.clone()));
        }
    }
    if let Some(text) = &model.text {
        rows.extend(text_rows(model, text));
    }
    if let Some(image) = &model.image {
        rows.push(setting("image", "preprocessing", image.describe()));
    }
    if let Some(bytes) = &model.bytes {
        rows.push(setting("bytes", "preprocessing", bytes.describe()));
    }
    if let Some(labels) = &model.labels {
        rows.push(setting(
            "classes",
            "labels",
            labels.describe(&model.signature),
        ));
    }
    described(&rows)
}

/// DESCRIBE MODEL's rows as its batch: kind, name, type, and the shape where there is one
/// (settings and return types have none).
fn described(rows: &[[String; 4]]) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("kind", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new("shape", DataType::Utf8, true),
    ]));
    let mut columns: Vec<ArrayRef> = (0..3)
        .map(|c| {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r[c].clone()),
            )) as ArrayRef
        })
        .collect();
    columns.push(Arc::new(
        rows.iter()
            .map(|r| (!r[3].is_empty()).then(|| r[3].clone()))
            .collect::<StringArray>(),
    ));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// DESCRIBE MODEL of an endpoint model: its definition, one setting a row (never a key).
pub fn describe_endpoint_batch(model: &crate::llm::EndpointModel) -> Result<RecordBatch> {
    let mut rows: Vec<[String; 4]> = model
        .endpoint
        .described()
        .into_iter()
        .map(|(name, value)| setting("endpoint", &name, value))
        .collect();
    rows.push(setting(
        "endpoint",
        "definition sha256",
        model.sha256.clone(),
    ));
    described(&rows)
}

/// A row of DESCRIBE MODEL without a shape.
fn setting(kind: &str, name: &str, value: String) -> [String; 4] {
    [kind.into(), name.into(), value, String::new()]
}

/// The inputs and outputs with their element types and shapes, and what predict returns.
fn tensor_rows(model: &Model) -> Vec<[String; 4]> {
    let mut rows = Vec::new();
    for (kind, specs) in [
        ("input", &model.signature.inputs),
        ("output", &model.signature.outputs),
    ] {
        for spec in specs {
            let element = spec
                .element
                .map(|e| crate::tensor::element::element_name(e).to_string())
                .unwrap_or_else(|| spec.description.clone());
            rows.push([kind.into(), spec.name.clone(), element, spec.shape_text()]);
        }
    }
    rows.push(setting(
        "returns",
        "predict",
        model.predict_type().to_string(),
    ));
    rows
}

/// The class labels, producer, operator sets and doc string, those the model file has.
fn about_rows(model: &Model) -> Vec<[String; 4]> {
    let about = &model.about;
    let opsets: Vec<String> = about
        .opsets
        .iter()
        .map(|(domain, version)| {
            let domain = if domain.is_empty() { "ai.onnx" } else { domain };
            format!("{domain} {version}")
        })
        .collect();
    [
        ("labels", about.labels.join(", ")),
        ("producer", about.producer.clone()),
        ("opsets", opsets.join(", ")),
        ("doc string", about.doc_string.clone()),
    ]
    .into_iter()
    .filter(|(_, value)| !value.is_empty())
    .map(|(name, value)| setting("model", name, value))
    .collect()
}

/// A text model's output, tokenizer and settings, and what embed returns.
fn text_rows(model: &Model, text: &super::text::TextConfig) -> Vec<[String; 4]> {
    let mut rows = Vec::new();
    let output = super::embed::text_output(model);
    let dim = match &output {
        Ok((_, dim)) => dim.to_string(),
        Err(e) => e.to_string(),
    };
    if let Ok((index, _)) = output {
        rows.push(setting(
            "text",
            "output",
            model.signature.outputs[index].name.clone(),
        ));
    }
    rows.push(setting("text", "tokenizer", "tokenizer.json".into()));
    rows.push(setting("text", "pooling", text.pooling.name().into()));
    rows.push(setting("text", "normalize", text.normalize.to_string()));
    rows.push(setting("text", "max_tokens", text.max_tokens.to_string()));
    rows.push(setting(
        "returns",
        "embed",
        format!("FixedSizeList({dim} x Float32)"),
    ));
    rows
}
