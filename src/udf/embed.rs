//! `embed('model', text)`: one vector per text, from a text model (a model folder with
//! `tokenizer.json`).
//!
//! ```sql
//! CREATE TABLE doc_vectors AS SELECT id, embed('minilm', body) AS v FROM 'docs/*.parquet';
//! ```
//! Returns `FixedSizeList<Float32, dim>`; NULL text gives a NULL vector, empty text a vector. An
//! `embed` of a literal is folded into a constant at planning time: computed once per query.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, FixedSizeListArray, Float32Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use datafusion::config::ConfigOptions;

use crate::config::BatchInferOptions;
use crate::error::Error;
use crate::model::embed::{EmbedOptions, embed_texts, embedding_dim};
use crate::model::{Model, ModelRegistry};

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
        let binding = |message: String| Error::Binding {
            model: name.to_string(),
            message,
        };
        let dim = embedding_dim(&model).map_err(binding)?;
        if !matches!(
            text_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return Err(binding(format!("embed takes a text column, got {text_type}")).into());
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
        let (_, dim) = self.model(&name, args.arg_fields[1].data_type(), None)?;
        Ok(Arc::new(Field::new(self.name(), vector_type(dim), true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = match &args.args[0] {
            ColumnarValue::Scalar(value) => model_name_of(Some(value))?,
            _ => model_name_of(None)?,
        };
        let rows = args.number_rows;
        let texts = cast(&args.args[1].to_array(rows)?, &DataType::Utf8)?;
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let (model, dim) = self.model(&name, texts.data_type(), Some(&args.config_options))?;
        let texts = texts.as_string::<i32>();
        let present: Vec<&str> = texts.iter().flatten().collect();
        let options = EmbedOptions {
            token_budget: session
                .and_then(|o| o.token_budget)
                .unwrap_or_else(|| model.device().token_budget()),
            ..EmbedOptions::default()
        };
        let vectors =
            embed_texts(&model, &present, options).map_err(|message| Error::Inference {
                model: name.clone(),
                first_row: 0,
                end_row: rows,
                message,
            })?;
        // NULL texts were skipped: spread the vectors back over the rows, zeros under NULLs.
        let values = if texts.null_count() == 0 {
            vectors
        } else {
            let mut all = vec![0f32; rows * dim];
            let mut next = vectors.chunks_exact(dim);
            for row in 0..rows {
                if texts.is_valid(row)
                    && let Some(v) = next.next()
                {
                    all[row * dim..(row + 1) * dim].copy_from_slice(v);
                }
            }
            all
        };
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        let array = FixedSizeListArray::try_new(
            item,
            dim as i32,
            Arc::new(Float32Array::from(values)),
            texts.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(array)))
    }
}
