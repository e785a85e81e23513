//! `CREATE [OR REPLACE] MODEL name OPTIONS (...)` without FROM: an endpoint model
//! ([`crate::llm`]), kept in the warehouse as a version whose definition is its options.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Catalog;
use super::models::{Adding, newest};
use crate::error::Result;
use crate::llm::Endpoint;
use crate::model::versions::Version;

impl Catalog {
    /// Defines endpoint model `name` from `options` (keyed in lower case), as its first version
    /// (or its newest, `or_replace`); without a warehouse, this process's alone.
    pub(super) async fn create_endpoint(
        &self,
        name: &str,
        or_replace: bool,
        options: &BTreeMap<String, String>,
    ) -> Result<()> {
        self.check_definable(name, or_replace)?;
        let endpoint = Endpoint::from_options(name, options)?;
        let mut version = Version::new(
            Some(endpoint.sha256()),
            endpoint.endpoint.clone(),
            endpoint.endpoint.clone(),
        );
        version.endpoint = Some(endpoint.to_json());
        let model = Arc::new(self.endpoint_model(name, endpoint)?);
        let number = match &self.warehouse {
            Some(_) => {
                let adding = if or_replace {
                    Adding::Replace
                } else {
                    Adding::Create
                };
                let definition = self.keep_version(name, version, adding).await?;
                self.register_definition(name, &definition, None);
                Some(newest(&definition))
            }
            None => {
                self.registry.register_endpoint(name, model.clone());
                None
            }
        };
        crate::say!(
            "model '{name}' {} as {} at {} (definition sha256 {}){}",
            if or_replace { "defined" } else { "created" },
            model.endpoint.model,
            model.endpoint.endpoint,
            model.sha256,
            number.map_or_else(String::new, |n| format!(", version {n}"))
        );
        Ok(())
    }
}
