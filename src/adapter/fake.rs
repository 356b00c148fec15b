//! The adapter for the fake harness family: directives are the whole "task".

use super::RegistryError;

pub fn validate_directives(directives: &[String]) -> Result<(), RegistryError> {
    crate::fake_harness::parse_all(directives)
        .map(|_| ())
        .map_err(|e| RegistryError::Directives {
            family: "fake".into(),
            detail: e.to_string(),
        })
}
