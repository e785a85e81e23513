//! Input files a refresh cannot read. One junk file must not stop a view for good: the file is
//! kept in the generation as a unit of its own with no rows and the error (so the next refresh
//! does not try it again until it changes), the other files are scored, and SHOW MATERIALIZED
//! VIEWS lists it. Only errors that are the file's count: what it holds cannot be read as the
//! view's input (not Parquet, damaged pages, a footer that lies, columns of other types). A
//! model that fails, a store that cannot be reached, a file that changed while it was read or a
//! cancellation fail the refresh as before: they are no reason to leave a file out.

use datafusion::error::DataFusionError;

use crate::error::Error;

/// Whether `error`, met scoring one commit's input files, is the files' own (see the module).
pub fn blames_the_files(error: &Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(now) = cause {
        if let Some(ours) = now.downcast_ref::<Error>() {
            match ours {
                Error::Runtime(_)
                | Error::UnknownModel { .. }
                | Error::ModelLoad { .. }
                | Error::Binding { .. }
                | Error::Inference { .. }
                | Error::Output { .. }
                | Error::Cancelled(_)
                | Error::Usage(_)
                | Error::Io { .. } => return false,
                Error::ObjectStore(e) => return is_content_check(e),
                Error::Arrow(_) => return true,
                // Transparent: its `source` would skip DataFusion's own error.
                Error::DataFusion(e) => {
                    cause = Some(e);
                    continue;
                }
                _ => {}
            }
        }
        if let Some(theirs) = now.downcast_ref::<DataFusionError>() {
            match theirs {
                DataFusionError::ResourcesExhausted(_) | DataFusionError::IoError(_) => {
                    return false;
                }
                DataFusionError::ObjectStore(e) => return is_content_check(e),
                DataFusionError::ParquetError(_) | DataFusionError::ArrowError(..) => return true,
                _ => {}
            }
        }
        if let Some(store) = now.downcast_ref::<object_store::Error>() {
            return is_content_check(store);
        }
        cause = now.source();
    }
    true
}

/// A store error that says what a file holds (its footer checked by batchinfer), not that the
/// store could not be reached.
fn is_content_check(error: &object_store::Error) -> bool {
    matches!(
        error,
        object_store::Error::Generic {
            store: "batchinfer",
            ..
        }
    )
}

#[cfg(test)]
#[test]
fn only_what_a_file_holds_leaves_it_out() {
    let parquet = Error::DataFusion(DataFusionError::ParquetError(Box::new(
        datafusion::parquet::errors::ParquetError::General("bad page".into()),
    )));
    assert!(blames_the_files(&parquet));
    let footer = Error::ObjectStore(object_store::Error::Generic {
        store: "batchinfer",
        source: "x.parquet is not a Parquet file".into(),
    });
    assert!(blames_the_files(&footer));
    let wrapped = Error::DataFusion(DataFusionError::External(Box::new(footer)));
    assert!(blames_the_files(&wrapped));
    let network = Error::ObjectStore(object_store::Error::Generic {
        store: "S3",
        source: "connection refused".into(),
    });
    assert!(!blames_the_files(&network));
    let model = Error::DataFusion(DataFusionError::External(Box::new(Error::Inference {
        model: "m".into(),
        first_row: 0,
        end_row: 1,
        message: "Gather".into(),
    })));
    assert!(!blames_the_files(&model));
    assert!(!blames_the_files(&Error::Cancelled("SIGINT")));
    assert!(!blames_the_files(&Error::Usage(
        "the input file x changed while this refresh read it".into()
    )));
}
