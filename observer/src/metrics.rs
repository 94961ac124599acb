//! The observer's Prometheus metrics.

pub const TRANSITIONS: &str = "dltsub_status_transitions_total";
pub const POLLS: &str = "dltsub_status_polls_total";
pub const POLL_ERRORS: &str = "dltsub_status_poll_errors_total";

pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(
        TRANSITIONS,
        "Batch status transitions recorded, by new status"
    );
    describe_counter!(POLLS, "Batch-status requests to the ledger");
    describe_counter!(POLL_ERRORS, "Batch-status requests that failed");
}
