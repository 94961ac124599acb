//! The submission path's Prometheus metrics.

pub const SUBMISSIONS: &str = "dltsub_submissions_total";
/// Batches by the outcome of the POST that carried them (one POST may carry several).
pub const SUBMITTED_BATCHES: &str = "dltsub_submitted_batches_total";
pub const POST_SECONDS: &str = "dltsub_dlt_post_seconds";
pub const IN_FLIGHT: &str = "dltsub_batches_in_flight";
pub const SELF_FENCED: &str = "dltsub_self_fenced_total";

/// The `outcome` label of [`SUBMISSIONS`] and [`SUBMITTED_BATCHES`]. The alerting rules in
/// `deploy/prometheus/` select on these values; a test checks they exist.
pub const OUTCOME_ACCEPTED: &str = "accepted";
pub const OUTCOME_REJECTED: &str = "rejected";
pub const OUTCOME_BACK_PRESSURE: &str = "back_pressure";
pub const OUTCOME_SELF_FENCED: &str = "self_fenced";
pub const OUTCOME_NOT_SENT: &str = "not_sent";
pub const OUTCOME_IN_DOUBT: &str = "in_doubt";
pub const OUTCOMES: &[&str] = &[
    OUTCOME_ACCEPTED,
    OUTCOME_REJECTED,
    OUTCOME_BACK_PRESSURE,
    OUTCOME_SELF_FENCED,
    OUTCOME_NOT_SENT,
    OUTCOME_IN_DOUBT,
];

/// Bucket bounds (seconds) for request latencies, so Prometheus can aggregate them across
/// instances (the exporter renders summaries otherwise).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        SUBMISSIONS,
        "POSTs to the ledger by outcome (accepted, rejected, back_pressure, not_sent, in_doubt, self_fenced)"
    );
    describe_counter!(
        SUBMITTED_BATCHES,
        "Batches by the outcome of the POST that carried them"
    );
    describe_histogram!(
        POST_SECONDS,
        Unit::Seconds,
        "Duration of one POST to the ledger"
    );
    describe_gauge!(
        IN_FLIGHT,
        "Batches of this instance between mark SUBMITTING and the ledger's answer"
    );
    // Every outcome exists from the start (at 0), so a rate over the first failures is
    // not lost to a series that did not exist yet.
    for outcome in OUTCOMES {
        metrics::counter!(SUBMISSIONS, "outcome" => *outcome).increment(0);
        metrics::counter!(SUBMITTED_BATCHES, "outcome" => *outcome).increment(0);
    }
    describe_counter!(
        SELF_FENCED,
        "Submissions not started because the claim's self-fencing term had run out"
    );
}
