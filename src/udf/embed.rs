//! `embed('model', text)`: one vector per text, from a text model (a model folder with
//! `tokenizer.json`).
//!
//! ```sql
//! CREATE TABLE doc_vectors AS SELECT id, embed('minilm', body) AS v FROM 'docs/*.parquet';
//! ```
//! Returns `FixedSizeList<Float32, dim>`; NULL text gives a NULL vector, empty text a vector. An
//! `embed` of a literal is folded into a constant at planning time: computed once per query.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use datafusion::config::ConfigOptions;

use crate::config::{BatchInferOptions, OnError};
use crate::error::Error;
use crate::model::embed::{EmbedOptions, embed_texts, embedding_dim};
use crate::model::{Model, ModelRegistry};
use crate::rejects;
use crate::statement_context::StatementContext;

/// The `embed` scalar function over a [`ModelRegistry`].
#[derive(Debug)]
pub struct EmbedUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
}

impl EmbedUdf {
    pub fn new(registry: Arc<ModelRegistry>) -> Self {
        EmbedUdf {
            signature: Signature::any(2, Volatility::Immutable),
            registry,
        }
    }

    fn model(
        &self,
        name: &str,
        text_type: &DataType,
        config: Option<&ConfigOptions>,
    ) -> Result<(Arc<Model>, usize)> {
        let model = self
            .registry
            .resolve(name, super::device_of(config), config)?;
        let binding = |e: Error| Error::Binding {
            model: name.to_string(),
            message: e.to_string(),
        };
        let dim = embedding_dim(&model).map_err(binding)?;
        let text = |t: &DataType| {
            matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
            )
        };
        let dictionary_of_text =
            matches!(text_type, DataType::Dictionary(_, values) if text(values));
        if !text(text_type) && !dictionary_of_text {
            return Err(binding(crate::error::Error::Tensor(format!(
                "embed takes a text column, got {text_type}"
            )))
            .into());
        }
        Ok((model, dim))
    }
}

fn vector_type(dim: usize) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        dim as i32,
    )
}

super::same_registry_identity!(EmbedUdf);

fn model_name_of(arg: Option<&ScalarValue>) -> Result<String> {
    super::model_name(
        arg,
        "embed: the first argument must be the model's name as a string literal, as in embed('minilm', body)",
    )
}

impl ScalarUDFImpl for EmbedUdf {
    fn name(&self) -> &str {
        "embed"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        exec_err!("embed: the result type is derived from the model in return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let name = model_name_of(args.scalar_arguments.first().copied().flatten())?;
        if let Some(endpoint) = self.registry.endpoint_if(&name, None)? {
            let dim = super::embed_endpoint::dimensions(&endpoint)?;
            return Ok(Arc::new(Field::new(self.name(), vector_type(dim), true)));
        }
        let (_, dim) = self.model(&name, args.arg_fields[1].data_type(), None)?;
        Ok(Arc::new(Field::new(self.name(), vector_type(dim), true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = match &args.args[0] {
            ColumnarValue::Scalar(value) => model_name_of(Some(value))?,
            _ => model_name_of(None)?,
        };
        if let Some(endpoint) = self
            .registry
            .endpoint_if(&name, Some(&args.config_options))?
        {
            return super::embed_endpoint::invoke(&endpoint, &args, self.registry.stores());
        }
        let rows = args.number_rows;
        let text_array = cast(&args.args[1].to_array(rows)?, &DataType::Utf8)?;
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let (model, dim) = self.model(&name, text_array.data_type(), Some(&args.config_options))?;
        if crate::llm::estimate::Estimates::of(statement).is_some() {
            // An estimate of what endpoints cost runs no local model.
            let none =
                datafusion::arrow::array::new_null_array(args.return_field.data_type(), rows);
            return Ok(ColumnarValue::Array(none));
        }
        let texts = text_array.as_string::<i32>();
        let present: Vec<&str> = texts.iter().flatten().collect();
        let options = EmbedOptions {
            token_budget: session
                .and_then(|o| o.token_budget)
                .unwrap_or_else(|| model.device().token_budget()),
            stop: statement.stop(),
            ..EmbedOptions::default()
        };
        let on_error = session.map_or(OnError::Fail, |o| o.on_error);
        let (vectors, failed) = if on_error == OnError::Fail {
            let vectors = embed_texts(&model, &present, options).map_err(|message| {
                options.stop.check().err().unwrap_or(Error::Inference {
                    model: name.clone(),
                    first_row: 0,
                    end_row: rows,
                    message: message.to_string(),
                })
            })?;
            (vectors, Vec::new())
        } else {
            let mut isolated = Isolated::default();
            isolated.embed(&model, &present, 0, options, dim);
            // Calls stopped by a stop signal failed no text of their own.
            options.stop.check()?;
            (isolated.vectors, isolated.failed)
        };
        let (values, failed) = spread(texts, rows, dim, vectors, failed);
        if let Some(session) = session {
            if session.on_error == OnError::Reject {
                let fields = args.arg_fields.get(1..2).unwrap_or_default();
                let columns = [text_array.clone()];
                let stores = self.registry.stores();
                rejects::keep(
                    stores,
                    statement,
                    (&*model).into(),
                    fields,
                    &columns,
                    &failed,
                )?;
            }
            rejects::count(session, statement, &name, present.len(), &failed)?;
        }
        Ok(ColumnarValue::Array(vector_column(
            texts, rows, dim, values, &failed,
        )?))
    }
}

/// The vectors of the texts that are not NULL (and their failures) spread back over the rows:
/// zeros under NULLs.
pub(super) fn spread(
    texts: &StringArray,
    rows: usize,
    dim: usize,
    vectors: Vec<f32>,
    failed: Vec<(usize, String)>,
) -> (Vec<f32>, Vec<(usize, String)>) {
    // NULL texts were skipped: spread the vectors back over the rows, zeros under NULLs.
    let rows_of: Vec<usize> = (0..rows).filter(|&r| texts.is_valid(r)).collect();
    let failed: Vec<(usize, String)> = failed
        .into_iter()
        .map(|(k, message)| (rows_of[k], message))
        .collect();
    let values = if texts.null_count() == 0 {
        vectors
    } else {
        let mut all = vec![0f32; rows * dim];
        for (row, v) in rows_of.iter().zip(vectors.chunks_exact(dim)) {
            all[row * dim..(row + 1) * dim].copy_from_slice(v);
        }
        all
    };
    (values, failed)
}

/// The `FixedSizeList` column of `values`: NULL under a NULL text and under a text the model
/// failed on.
pub(super) fn vector_column(
    texts: &StringArray,
    rows: usize,
    dim: usize,
    values: Vec<f32>,
    failed: &[(usize, String)],
) -> Result<ArrayRef> {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    // NULL under a NULL text and under a text the model failed on.
    let nulls = match failed.is_empty() {
        true => texts.nulls().cloned(),
        false => {
            let mut valid: Vec<bool> = (0..rows).map(|r| texts.is_valid(r)).collect();
            for (row, _) in failed {
                valid[*row] = false;
            }
            Some(datafusion::arrow::buffer::NullBuffer::from(valid))
        }
    };
    let array = FixedSizeListArray::try_new(
        item,
        dim as i32,
        Arc::new(Float32Array::from(values)),
        nulls,
    )?;
    Ok(Arc::new(array))
}

/// Texts embedded with the failing ones isolated (`on_error` 'null' or 'reject'): a failing call
/// is split in halves until the texts that fail on their own are found; they get zeros (NULL
/// once spread back) and are recorded with the model's message. A text's vector never depends
/// on which texts shared its call.
#[derive(Default)]
struct Isolated {
    vectors: Vec<f32>,
    failed: Vec<(usize, String)>,
}

impl Isolated {
    fn embed(
        &mut self,
        model: &Model,
        texts: &[&str],
        first: usize,
        options: EmbedOptions,
        dim: usize,
    ) {
        if texts.is_empty() || options.stop.requested().is_some() {
            return;
        }
        match embed_texts(model, texts, options) {
            Ok(vectors) => self.vectors.extend(vectors),
            Err(message) if texts.len() == 1 => {
                self.vectors.extend(std::iter::repeat_n(0f32, dim));
                self.failed.push((first, message.to_string()));
            }
            Err(_) => {
                let half = texts.len() / 2;
                self.embed(model, &texts[..half], first, options, dim);
                self.embed(model, &texts[half..], first + half, options, dim);
            }
        }
    }
}
