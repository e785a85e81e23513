//! An error that is a file's own: what it holds cannot be read as the table it is read as (it
//! is not Parquet, its pages are damaged, its footer lies, its columns are not the table's).
//! Raised where that is known, so that a caller can tell it from every other failure (a store
//! that cannot be reached, a disk that is full, a model that fails): a materialized view leaves
//! such a file out and goes on, and stops at anything else.

use std::fmt;

/// What is wrong with a file's content, naming the file.
#[derive(Debug)]
pub struct Unreadable(pub String);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreadable {}

/// Whether `error`, or an error under it, is an [`Unreadable`].
pub fn is_unreadable(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    // Errors nest a few levels; a chain that loops is not followed for ever.
    for _ in 0..64 {
        let Some(now) = cause else {
            return false;
        };
        if now.is::<Unreadable>() {
            return true;
        }
        cause = now.source();
    }
    false
}
