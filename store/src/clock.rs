//! The database clock.
//!
//! Every lease and backoff decision compares times read from the database, never from the
//! instance: redundant instances on different hosts disagree about the time, the database
//! does not. Times are BIGINT microseconds since the Unix epoch on both backends.

use diesel::QueryResult;
use diesel::expression::{AppearsOnTable, Expression, SelectableExpression, ValidGrouping};
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::BigInt;
use diesel::sqlite::Sqlite;

/// `now` on the database clock, in microseconds since the Unix epoch, plus an offset.
///
/// The offset is zero in production. Tests give each simulated instance its own offset to
/// move time forward (past an expiry) without sleeping.
///
/// PostgreSQL uses `statement_timestamp()` rather than `clock_timestamp()`: it is stable
/// within one statement, so every row of a set-based update sees the same `now` and the
/// planner may still use an index for comparisons with it.
#[derive(Debug, Clone, Copy, QueryId)]
pub struct DbNowMicros {
    offset_us: i64,
}

impl DbNowMicros {
    pub fn with_offset(offset_us: i64) -> Self {
        Self { offset_us }
    }
}

impl Expression for DbNowMicros {
    type SqlType = BigInt;
}

impl<QS> AppearsOnTable<QS> for DbNowMicros {}
impl<QS> SelectableExpression<QS> for DbNowMicros {}

impl<GroupBy> ValidGrouping<GroupBy> for DbNowMicros {
    type IsAggregate = diesel::expression::is_aggregate::Never;
}

impl QueryFragment<Pg> for DbNowMicros {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("(CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT) + ");
        out.push_bind_param::<BigInt, _>(&self.offset_us)?;
        out.push_sql(")");
        Ok(())
    }
}

impl QueryFragment<Sqlite> for DbNowMicros {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        // SQLite keeps 'now' fixed for the duration of one statement step, like
        // statement_timestamp(). `unixepoch('subsec')` has millisecond resolution.
        out.push_sql("(CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ");
        out.push_bind_param::<BigInt, _>(&self.offset_us)?;
        out.push_sql(")");
        Ok(())
    }
}
