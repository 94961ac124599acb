//! The queuer's Prometheus metrics. Names carry the `dltsub_` prefix and base units.

pub const CLAIMS_HELD: &str = "dltsub_claims_held";
pub const CLAIMS_ACQUIRED: &str = "dltsub_claims_acquired_total";
pub const CLAIMS_RELEASED: &str = "dltsub_claims_released_total";
pub const CLAIMS_LOST: &str = "dltsub_claims_lost_total";
pub const FENCED_WRITES_REJECTED: &str = "dltsub_fenced_writes_rejected_total";
pub const TICK_SECONDS: &str = "dltsub_queuer_tick_seconds";
pub const TICK_ERRORS: &str = "dltsub_queuer_tick_errors_total";
pub const IS_LEADER: &str = "dltsub_leader";
pub const GONE_HOLDERS: &str = "dltsub_gone_holders_total";

/// Registers help text for every queuer metric; call once at start-up.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        CLAIMS_HELD,
        "Service claims this instance holds after its last tick"
    );
    describe_counter!(
        CLAIMS_ACQUIRED,
        "Service claims acquired (new or taken over)"
    );
    describe_counter!(
        CLAIMS_RELEASED,
        "Service claims handed back (rebalancing or shutdown)"
    );
    describe_counter!(
        CLAIMS_LOST,
        "Service claims found taken over by another instance or expired"
    );
    describe_counter!(
        FENCED_WRITES_REJECTED,
        "Writes refused because the claim's epoch was no longer ours"
    );
    describe_histogram!(TICK_SECONDS, Unit::Seconds, "Duration of one claim tick");
    describe_counter!(
        TICK_ERRORS,
        "Claim ticks that failed (database unreachable, timeout)"
    );
    describe_counter!(
        GONE_HOLDERS,
        "Claim holders this instance found gone (no database session or process left) with a batch mid-submission; their services moved at the fast expiry"
    );
    describe_gauge!(
        IS_LEADER,
        "1 while this instance holds the cluster leader lease"
    );
}
