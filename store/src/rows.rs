//! Rows as they are inserted. Plain values only (times read once per transaction from the
//! database clock), so one struct serves both backends' insert paths in `dialect`.

use diesel::prelude::*;

use crate::schema::{batch_events, batch_statuses, batches};

#[derive(Debug, Insertable)]
#[diesel(table_name = batches)]
pub(crate) struct NewBatchRow<'a> {
    pub service_id: &'a str,
    pub batch_id: &'a str,
    pub serialized_batch: &'a [u8],
    pub created_at_us: i64,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = batch_statuses)]
pub(crate) struct NewStatusRow<'a> {
    pub seq: i64,
    pub service_id: &'a str,
    pub status: &'a str,
    pub next_attempt_at_us: i64,
    pub updated_at_us: i64,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = batch_events)]
pub(crate) struct NewEventRow<'a> {
    pub seq: i64,
    pub old_status: Option<&'a str>,
    pub new_status: &'a str,
    pub epoch: Option<i64>,
    pub instance_id: Option<&'a str>,
    pub detail: Option<&'a str>,
    pub at_us: i64,
}
