//! Decoding rows by column name, with a typed error that names the column.
//!
//! **Never:** a positional `Row::get(i)` in new code: a statement whose select list changes
//! must fail at decode with the column's name, not panic or, worse, decode the wrong column.

use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use super::error::AuthorityError;

/// Column access by name that reports a missing column, a wrong type, a NULL where none is
/// allowed, or an unknown state as [`AuthorityError::Decode`].
pub trait RowExt {
    fn col<'a, T: FromSql<'a>>(&'a self, name: &str) -> Result<T, AuthorityError>;
}

impl RowExt for Row {
    fn col<'a, T: FromSql<'a>>(&'a self, name: &str) -> Result<T, AuthorityError> {
        self.try_get(name).map_err(|e| AuthorityError::Decode {
            column: name.to_string(),
            detail: super::error::with_causes(&e),
        })
    }
}
