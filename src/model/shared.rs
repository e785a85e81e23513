//! Models by content across a cluster. A client sends, with each query, the definition of every
//! model it knows (`batchinfer_statement.models`, [`crate::statement_context`]): name, source, and the sha256 of the
//! bytes it loaded. The scheduler and the executors resolve a name through the definitions of the
//! query at hand to a model kept per (source, sha256), never per name, and check that the bytes
//! they load hash to what the client loaded. So two clients that define one name differently, or
//! a model replaced since an executor first loaded it, always get the model their client meant,
//! or an error saying that the file changed; never another model's scores.

use super::ModelSource;
use crate::error::Result;
pub use crate::statement_context::{SharedModel, SharedModels};

impl SharedModel {
    pub fn model_source(&self) -> Result<ModelSource> {
        ModelSource::parse(&self.source)
    }

    /// The key a process keeps this model under.
    pub fn key(&self) -> (String, String) {
        (self.source.clone(), self.sha256.clone().unwrap_or_default())
    }
}
