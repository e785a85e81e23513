//! `DROP MODEL [IF EXISTS] name`: the model unregistered, and its definition and versions
//! removed from the warehouse (a definition that cannot be read too).

use super::Catalog;
use crate::error::{Error, Result};
use crate::warehouse::check_name;

impl Catalog {
    /// Drops model `name`; one there is not is an error unless `if_exists`.
    pub(super) async fn drop_model(&self, name: String, if_exists: bool) -> Result<()> {
        check_name("model", &name)?;
        self.check_not_a_folder_model(&name)?;
        let known = self.registry.unregister_model(&name);
        // A definition that cannot be read (left out with a warning) is dropped too.
        let unusable = match (&self.warehouse, known) {
            (Some(warehouse), false) => warehouse.definitions().await?.unusable.contains_key(&name),
            _ => false,
        };
        if !known && !unusable && !if_exists {
            return Err(Error::UnknownModel {
                name,
                available: format!("the models are: {}", self.registry.names().join(", ")),
            });
        }
        if let Some(warehouse) = &self.warehouse
            && (known || unusable)
        {
            warehouse.remove_model(&name).await?;
            self.seen_models().remove(&name);
        }
        if known || unusable {
            crate::say!("model '{name}' dropped");
        }
        Ok(())
    }
}
