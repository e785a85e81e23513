//! `predict('model', col, ...)`: runs a model over the rows of a query.
//!
//! ```sql
//! SELECT id, predict('churn', city, age, spend)['probabilities'] AS p FROM 'customers.parquet';
//! ```
//! The model name must be a string literal: the model is looked up (and loaded) while the query
//! is planned, which fixes the result type from the model's outputs and turns an unknown model
//! or columns that do not fit into a planning error, before any row is read.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};

use datafusion::config::ConfigOptions;

use crate::config::{BatchInferOptions, OnError};
use crate::error::Error;
use crate::model::ModelRegistry;
use crate::model::score::{ScoreOptions, score};
use crate::rejects;
use crate::statement_context::StatementContext;
use crate::tensor::input::InputBinding;

/// The `predict` scalar function over a [`ModelRegistry`].
#[derive(Debug)]
pub struct PredictUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
}

impl PredictUdf {
    pub fn new(registry: Arc<ModelRegistry>) -> Self {
        PredictUdf {
            signature: Signature::variadic_any(Volatility::Immutable),
            registry,
        }
    }

    fn bind(
        &self,
        name: &str,
        features: &[FieldRef],
        config: Option<&ConfigOptions>,
    ) -> Result<(Arc<crate::model::Model>, InputBinding)> {
        let model = self
            .registry
            .resolve(name, super::device_of(config), config)?;
        // By position: columns named after the inputs were put in their order before planning
        // (`super::by_name`).
        let types: Vec<DataType> = features.iter().map(|f| f.data_type().clone()).collect();
        let binding =
            InputBinding::plan(&model.signature, &types).map_err(|message| Error::Binding {
                model: name.to_string(),
                message: message.to_string(),
            })?;
        Ok((model, binding))
    }
}

super::same_registry_identity!(PredictUdf);

fn model_name_of(arg: Option<&ScalarValue>) -> Result<String> {
    super::model_name(
        arg,
        "predict: the first argument must be the model's name as a string literal, as in predict('churn', age, spend)",
    )
}

impl ScalarUDFImpl for PredictUdf {
    fn name(&self) -> &str {
        "predict"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        // The type depends on the model named by a literal: see return_field_from_args.
        exec_err!("predict: the result type is derived from the model in return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let name = model_name_of(args.scalar_arguments.first().copied().flatten())?;
        let features = args.arg_fields.get(1..).unwrap_or_default();
        let (model, _) = self.bind(&name, features, None)?;
        Ok(Arc::new(Field::new(
            self.name(),
            model.signature.output_type.clone(),
            true,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = match args.args.first() {
            Some(ColumnarValue::Scalar(value)) => model_name_of(Some(value))?,
            _ => model_name_of(None)?,
        };
        let rows = args.number_rows;
        let columns = args.args[1..]
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let features = args.arg_fields.get(1..).unwrap_or_default();
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let (model, binding) = self.bind(&name, features, Some(&args.config_options))?;
        let options = session.map_or_else(ScoreOptions::default, |o| ScoreOptions {
            max_rows: o.batch_size,
            on_error: o.on_error,
            stop: statement.stop(),
            nulls: o.nulls,
        });
        let scoring = score(&model, &binding, &columns, rows, options)?;
        if let Some(session) = session {
            if session.on_error == OnError::Reject {
                let stores = self.registry.stores();
                rejects::keep(
                    stores,
                    statement,
                    (&*model).into(),
                    features,
                    &columns,
                    &scoring.failed,
                )?;
            }
            rejects::count(session, statement, &name, scoring.scored, &scoring.failed)?;
        }
        let result = scoring.result;
        if result.data_type() != args.return_field.data_type() {
            return exec_err!(
                "predict: model '{name}' now returns {}, but the query was planned for {} (was the model replaced?)",
                result.data_type(),
                args.return_field.data_type()
            );
        }
        Ok(ColumnarValue::Array(result))
    }

    fn documentation(&self) -> Option<&Documentation> {
        None
    }
}
