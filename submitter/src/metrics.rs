//! The submission path's Prometheus metrics.

pub const SUBMISSIONS: &str = "dltsub_submissions_total";
pub const POST_SECONDS: &str = "dltsub_dlt_post_seconds";
pub const IN_FLIGHT: &str = "dltsub_batches_in_flight";
pub const SELF_FENCED: &str = "dltsub_self_fenced_total";

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
    describe_histogram!(
        POST_SECONDS,
        Unit::Seconds,
        "Duration of one POST to the ledger"
    );
    describe_gauge!(
        IN_FLIGHT,
        "Batches of this instance between mark SUBMITTING and the ledger's answer"
    );
    describe_counter!(
        SELF_FENCED,
        "Submissions not started because the claim's self-fencing term had run out"
    );
}
