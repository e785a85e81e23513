//! Input files a refresh cannot read. One junk file must not stop a view for good: the file is
//! kept in the generation as a unit of its own with no rows and the error (so the next refresh
//! does not try it again until it changes), the other files are scored, and SHOW MATERIALIZED
//! VIEWS lists it. Only errors that are the file's count: what it holds cannot be read as the
//! view's input (not Parquet, damaged pages, a footer that lies, columns of other types), as
//! marked where it is found. A model that fails, a store that cannot be reached, a full disk, a
//! file that changed while it was read or a cancellation fail the refresh as before: they are
//! no reason to leave a file out.

use crate::error::Error;

/// Whether `error`, met scoring one commit's input files, is the files' own: only an error
/// raised as [`crate::storage::unreadable::Unreadable`] where a file's content was found
/// unreadable counts. Any other (a model, a store, a disk, a panic) is not a reason to leave a
/// file out.
pub fn blames_the_files(error: &Error) -> bool {
    match error {
        // Transparent: its `source` would skip DataFusion's own error.
        Error::DataFusion(e) => crate::storage::unreadable::is_unreadable(e),
        Error::ObjectStore(e) => crate::storage::unreadable::is_unreadable(e),
        e => crate::storage::unreadable::is_unreadable(e),
    }
}

#[cfg(test)]
#[test]
fn only_what_a_file_holds_leaves_it_out() {
    use crate::storage::unreadable::Unreadable;
    use datafusion::error::DataFusionError;
    let footer = Error::ObjectStore(object_store::Error::Generic {
        store: "batchinfer",
        source: Box::new(Unreadable("x.parquet is not a Parquet file".into())),
    });
    assert!(blames_the_files(&footer));
    let wrapped = Error::DataFusion(DataFusionError::External(Box::new(footer)));
    assert!(blames_the_files(&wrapped));
    let scan = Error::DataFusion(DataFusionError::Shared(std::sync::Arc::new(
        DataFusionError::External(Box::new(Unreadable("reading f: bad page".into()))),
    )));
    assert!(blames_the_files(&scan));
    // A Parquet error may be a write's (a full disk): not the input's.
    let parquet = Error::DataFusion(DataFusionError::ParquetError(Box::new(
        datafusion::parquet::errors::ParquetError::General("bad page".into()),
    )));
    assert!(!blames_the_files(&parquet));
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
    assert!(!blames_the_files(&Error::Internal("a panic".into())));
    assert!(!blames_the_files(&Error::Cancelled("SIGINT")));
}
