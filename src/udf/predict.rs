//! `predict('model', col, ...)`: runs a model over the rows of a query.
//!
//! ```sql
//! SELECT id, predict('churn', city, age, spend)['probabilities'] AS p FROM 'customers.parquet';
//! ```
//! The model name must be a string literal: the model is looked up (and loaded) while the query
//! is planned, which fixes the result type from the model's outputs and turns an unknown model
//! or columns that do not fit into a planning error, before any row is read.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, StringArray};
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
use crate::file_bytes::BytesSpec;
use crate::images::{self, ImageSpec};
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

    /// The block a bytes model reads at each end of a file (its batchinfer.json's `"bytes"`),
    /// where `name` is one; None for any other model, or a name that is not a model's.
    pub fn bytes_block(&self, name: &str, config: Option<&ConfigOptions>) -> Option<u64> {
        let model = self
            .registry
            .resolve(name, super::device_of(config), config)
            .ok()?;
        model.bytes.as_ref().map(|b| b.block as u64)
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
        let mut types: Vec<DataType> = features.iter().map(|f| f.data_type().clone()).collect();
        let bound = |message: Error| Error::Binding {
            model: name.to_string(),
            message: message.to_string(),
        };
        // Files (images, or bytes): the column feeds the model as its prepared rows will.
        if let Some(input) = file_input_of(&model, &types) {
            check_file_input(&model, &input).map_err(bound)?;
            types = vec![input.prepared_type()];
        }
        let binding = InputBinding::plan(&model.signature, &types).map_err(bound)?;
        Ok((model, binding))
    }
}

/// How a model reads the one column of files it is called on, as its folder declares.
enum FileInput<'m> {
    Image(&'m ImageSpec),
    Bytes(&'m BytesSpec),
}

impl FileInput<'_> {
    fn prepared_type(&self) -> DataType {
        match self {
            FileInput::Image(spec) => images::column::prepared_type(spec),
            FileInput::Bytes(spec) => spec.prepared_type(),
        }
    }

    /// A row's shape, and how the folder's declaration is named in a message.
    fn declared(&self) -> (Vec<i64>, String) {
        match self {
            FileInput::Image(spec) => (
                spec.row_shape(),
                format!(
                    "{} declares images of {:?} a row ({})",
                    spec.declared_in,
                    spec.row_shape(),
                    format!("{:?}", spec.layout).to_uppercase()
                ),
            ),
            FileInput::Bytes(spec) => (
                vec![spec.values_per_row() as i64],
                format!(
                    "batchinfer.json declares {} bytes a row (\"head\" {} + \"tail\" {})",
                    spec.values_per_row(),
                    spec.head,
                    spec.tail
                ),
            ),
        }
    }

    /// What the rejects keep of a row's file: its size.
    fn noun(&self) -> &'static str {
        match self {
            FileInput::Image(_) => "an image",
            FileInput::Bytes(_) => "a file",
        }
    }
}

/// How `model` reads its one column where it is called on a column of files.
fn file_input_of<'m>(model: &'m crate::model::Model, types: &[DataType]) -> Option<FileInput<'m>> {
    match (types, &model.image, &model.bytes) {
        ([t], Some(spec), _) if images::column::is_bytes(t) => Some(FileInput::Image(spec)),
        ([t], _, Some(spec)) if crate::file_bytes::is_file_column(t) => {
            Some(FileInput::Bytes(spec))
        }
        _ => None,
    }
}

/// Refuses a model whose one input does not take the rows its folder declares.
fn check_file_input(model: &crate::model::Model, input: &FileInput) -> crate::error::Result<()> {
    let inputs = &model.signature.inputs;
    let (declared, said) = input.declared();
    let fits = match inputs.as_slice() {
        [input] => {
            let shape = input.row_shape();
            shape.len() == declared.len()
                && shape
                    .iter()
                    .zip(&declared)
                    .all(|(d, want)| *d < 0 || d == want)
        }
        _ => false,
    };
    if fits {
        return Ok(());
    }
    Err(Error::Tensor(format!(
        "its folder's {said}, and the model's inputs are:\n{}",
        model.signature.describe_inputs()
    )))
}

/// How many of `features` the model reads: all but the column of file names the planner put
/// after a column of files (`crate::rules::file_names`).
fn model_arguments(features: &[FieldRef]) -> usize {
    match features {
        [_, name] if crate::blob::is_file_name(name) => 1,
        _ => features.len(),
    }
}

/// A row's file as a message names it: by its name where the query reads one.
fn file_of(names: Option<&StringArray>, row: usize) -> String {
    match names {
        Some(names) if names.is_valid(row) => format!("'{}' (row {row})", names.value(row)),
        _ => format!("of row {row}"),
    }
}

/// Rows of images prepared and scored at once: the next ones are prepared while the model
/// scores these.
const IMAGE_ROWS: usize = 64;

/// The most a run of prepared images takes (its float values).
const RUN_BYTES: usize = 256 << 20;

/// Scores a column of images: each run of [`IMAGE_ROWS`] prepared on the CPU cores while the
/// model scores the run before; images that cannot be read are their rows' errors.
fn score_images(
    model: &crate::model::Model,
    spec: &ImageSpec,
    binding: &InputBinding,
    column: &datafusion::arrow::array::ArrayRef,
    names: Option<&StringArray>,
    options: ScoreOptions,
) -> crate::error::Result<crate::model::score::Scoring> {
    let rows = column.len();
    // Fewer at once where each is large: a run's values take at most RUN_BYTES.
    let per_run = (RUN_BYTES / (spec.values_per_image().max(1) * 4)).clamp(1, IMAGE_ROWS);
    let runs: Vec<(usize, usize)> = (0..rows)
        .step_by(per_run)
        .map(|start| (start, per_run.min(rows - start)))
        .collect();
    let mut results = Vec::new();
    let mut failed = Vec::new();
    let mut scored = 0;
    std::thread::scope(|scope| -> crate::error::Result<()> {
        let prepare = |(start, len): (usize, usize)| {
            let part = column.slice(start, len);
            scope.spawn(move || images::column::prepare_column(spec, &part))
        };
        let mut next = runs.first().copied().map(prepare);
        for (i, &(start, len)) in runs.iter().enumerate() {
            options.stop.check()?;
            let prepared = next
                .take()
                .map(|p| p.join())
                .ok_or_else(|| Error::Internal("images not prepared".into()))?
                .map_err(|_| Error::Internal("preparing images panicked".into()))?;
            next = runs.get(i + 1).copied().map(prepare);
            let (values, unread) = prepared?;
            // A file that is not an image the model can read is the file's fault, not the
            // model's: a materialized view leaves it out, named, and scores the others.
            if options.on_error == OnError::Fail
                && let Some((row, why)) = unread.first()
            {
                return Err(Error::DataFusion(
                    datafusion::error::DataFusionError::External(Box::new(
                        crate::storage::unreadable::Unreadable(format!(
                            "model '{}': the image {}: {why}",
                            model.name,
                            file_of(names, start + row)
                        )),
                    )),
                ));
            }
            let scoring = score(model, binding, &[values], len, options)?;
            scored += scoring.scored;
            let mut here: Vec<(usize, String)> = unread
                .into_iter()
                .map(|(row, why)| (row, format!("the image: {why}")))
                .chain(scoring.failed)
                .map(|(row, why)| (start + row, why))
                .collect();
            here.sort_by_key(|(row, _)| *row);
            failed.extend(here);
            results.push(scoring.result);
        }
        Ok(())
    })?;
    let refs: Vec<&dyn Array> = results.iter().map(|a| a.as_ref()).collect();
    let result = match refs.len() {
        0 => datafusion::arrow::array::new_empty_array(&model.signature.output_type),
        _ => datafusion::arrow::compute::concat(&refs)?,
    };
    Ok(crate::model::score::Scoring {
        result,
        scored,
        failed,
    })
}

/// What the rejects keep of a column of files: their sizes, not their bytes.
fn described_files(
    input: &FileInput,
    features: &[FieldRef],
    columns: &[datafusion::arrow::array::ArrayRef],
    names: Option<&StringArray>,
) -> crate::error::Result<(Vec<FieldRef>, Vec<datafusion::arrow::array::ArrayRef>)> {
    let bytes = datafusion::arrow::compute::cast(&columns[0], &DataType::LargeBinary)?;
    let bytes = bytes.as_binary::<i64>();
    let noun = input.noun();
    let described: StringArray = (0..bytes.len())
        .map(|i| {
            bytes
                .is_valid(i)
                .then(|| format!("{noun} of {} bytes", bytes.value(i).len()))
        })
        .collect();
    let name = features.first().map_or("content", |f| f.name().as_str());
    let mut fields = vec![Arc::new(Field::new(name, DataType::Utf8, true))];
    let mut kept: Vec<datafusion::arrow::array::ArrayRef> = vec![Arc::new(described)];
    if let Some(names) = names {
        fields.insert(0, Arc::new(Field::new("filename", DataType::Utf8, true)));
        kept.insert(0, Arc::new(names.clone()));
    }
    Ok((fields, kept))
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
        let features = &features[..model_arguments(features)];
        let (model, _) = self.bind(&name, features, None)?;
        Ok(Arc::new(Field::new(
            self.name(),
            model.predict_type(),
            true,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = match args.args.first() {
            Some(ColumnarValue::Scalar(value)) => model_name_of(Some(value))?,
            _ => model_name_of(None)?,
        };
        let rows = args.number_rows;
        let mut columns = args.args[1..]
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let features = args.arg_fields.get(1..).unwrap_or_default();
        let features = &features[..model_arguments(features)];
        let names = columns.split_off(features.len());
        let names = names.first().and_then(|n| n.as_string_opt::<i32>());
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let (model, binding) = self.bind(&name, features, Some(&args.config_options))?;
        if crate::llm::estimate::Estimates::of(statement).is_some() {
            // An estimate of what endpoints cost runs no local model.
            let none =
                datafusion::arrow::array::new_null_array(args.return_field.data_type(), rows);
            return Ok(ColumnarValue::Array(none));
        }
        let options = session.map_or_else(ScoreOptions::default, |o| ScoreOptions {
            max_rows: o.batch_size,
            on_error: o.on_error,
            stop: statement.stop(),
            nulls: o.nulls,
        });
        let types: Vec<DataType> = features.iter().map(|f| f.data_type().clone()).collect();
        let file_input = file_input_of(&model, &types);
        let scoring = match &file_input {
            Some(FileInput::Image(spec)) => {
                score_images(&model, spec, &binding, &columns[0], names, options)?
            }
            Some(FileInput::Bytes(spec)) => {
                let prepared = spec.prepare_column(&columns[0])?;
                score(&model, &binding, &[prepared], rows, options)?
            }
            None => score(&model, &binding, &columns, rows, options)?,
        };
        if let Some(session) = session {
            if session.on_error == OnError::Reject {
                let stores = self.registry.stores();
                let (fields, kept) = match &file_input {
                    Some(input) => described_files(input, features, &columns, names)?,
                    None => (features.to_vec(), columns.clone()),
                };
                rejects::keep(
                    stores,
                    statement,
                    (&*model).into(),
                    &fields,
                    &kept,
                    &scoring.failed,
                )?;
            }
            rejects::count(session, statement, &name, scoring.scored, &scoring.failed)?;
        }
        let result = match &model.labels {
            Some(labels) => labels.add_to(&scoring.result, &model.predict_type())?,
            None => scoring.result,
        };
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
