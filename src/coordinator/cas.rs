//! A compare-and-swap written once, as a table of predicates, from which both the
//! statement's `WHERE` and the refusal's diagnosis are built — so the explanation of a
//! refused CAS can never drift from the CAS it explains.
//!
//! Each [`Pred`] is one SQL condition over the statement's table aliases, with the
//! category and detail a refusal reports when it is the first one that does not hold. The
//! CAS is the conjunction of every predicate (plus the join keys that say which rows they
//! speak about); the diagnosis evaluates each predicate on its own over the same rows,
//! reached by `LEFT JOIN`s from the row the request names, and reports the first that is
//! false or unknown (`NULL`: the row it needs is missing). Table order is diagnosis
//! priority.

use std::fmt::Write;

use tokio_postgres::Row;

use super::error::{AuthorityError, Category};
use super::rows::RowExt;

/// One expected-state predicate of a compare-and-swap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pred {
    /// An SQL boolean over the statement's aliases and parameters.
    pub sql: &'static str,
    /// What its failure is.
    pub category: Category,
    /// Why, for the operator (no parameter values: those may be secret-adjacent).
    pub detail: &'static str,
}

/// The predicates' conjunction, for the CAS's `WHERE` (after its join keys).
pub(crate) fn conjunction(preds: &[Pred]) -> String {
    preds
        .iter()
        .map(|p| format!("({})", p.sql))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The column the diagnosis names predicate `i` by.
fn column(i: usize) -> String {
    format!("pred_{i}")
}

/// The diagnosis statement: every predicate's truth (unknown counts as false) over
/// `from_where`, the `FROM … LEFT JOIN … WHERE <the named row>` that reaches the rows the
/// CAS compares. Binds the same parameters as the CAS.
pub(crate) fn diagnosis(preds: &[Pred], from_where: &str) -> String {
    let mut sql = String::from("SELECT ");
    for (i, p) in preds.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(sql, "coalesce(({}), false) AS {}", p.sql, column(i));
    }
    let _ = write!(sql, " {from_where}");
    sql
}

/// The first predicate the diagnosis row says does not hold.
pub(crate) fn first_failed<'p>(
    row: &Row,
    preds: &'p [Pred],
) -> Result<Option<&'p Pred>, AuthorityError> {
    for (i, p) in preds.iter().enumerate() {
        if !row.col::<bool>(&column(i))? {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &[Pred] = &[
        Pred {
            sql: "a.x = $1",
            category: Category::Mismatch,
            detail: "x differs",
        },
        Pred {
            sql: "a.deadline > clock_timestamp()",
            category: Category::Expired,
            detail: "expired",
        },
    ];

    #[test]
    fn the_cas_and_its_diagnosis_come_from_one_table() {
        assert_eq!(
            conjunction(T),
            "(a.x = $1) AND (a.deadline > clock_timestamp())"
        );
        let d = diagnosis(T, "FROM t a WHERE a.id = $2");
        assert_eq!(
            d,
            "SELECT coalesce((a.x = $1), false) AS pred_0, \
             coalesce((a.deadline > clock_timestamp()), false) AS pred_1 FROM t a WHERE a.id = $2"
        );
        for p in T {
            assert!(conjunction(T).contains(p.sql) && d.contains(p.sql));
        }
    }
}
