//! Telling that a claim holder's process is gone, so its services can move at the fast
//! expiry even when it died with a batch mid-submission (see `claims.rs`).
//!
//! Being wrong in one direction is harmless and in the other is bounded:
//! - judging a dead holder alive only makes its services wait for the slow expiry, as
//!   they did before this existed;
//! - judging a live holder gone (its database sessions lost, say) hands its services over
//!   at the fast expiry while a POST of its may still be under way. That POST started
//!   before the holder's self-fencing deadline, so it ends within `dlt_request_timeout`
//!   after the fast expiry; the new holder turns the batch IN_DOUBT and resubmits only
//!   after the ledger has called it Unknown for `unknown_grace`, which configuration keeps
//!   at least as long as the request timeout.
//!
//! So every probe here answers "gone" only on positive evidence.

/// A holder past its fast expiry with a batch mid-submission: the only kind whose
/// liveness matters (any other claim past its fast expiry is takeable already).
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub(crate) struct StuckHolder {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub instance_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub hostname: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub pid: i64,
    /// The `application_name` of its PostgreSQL sessions (see `InstanceInfo::session_tag`).
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub session_tag: String,
}

/// Whether process `pid` on this host has ended: no `/proc/<pid>`, or only its zombie
/// (killed, not yet reaped by its parent). `false` whenever procfs cannot tell — a
/// recycled pid included, which errs towards "alive".
pub(crate) fn local_process_gone(pid: i64) -> bool {
    if pid <= 0 || !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last ')', as comm may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
        Err(error) => error.kind() == std::io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive() {
        assert!(!local_process_gone(i64::from(std::process::id())));
    }

    #[test]
    fn an_exited_and_reaped_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i64::from(child.id());
        child.wait().unwrap();
        assert!(local_process_gone(pid));
    }

    #[test]
    fn a_killed_unreaped_child_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i64::from(child.id());
        child.kill().unwrap();
        // Not reaped yet: a zombie until `wait`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !local_process_gone(pid) {
            assert!(std::time::Instant::now() < deadline, "never seen gone");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait().unwrap();
    }

    #[test]
    fn nonsense_pids_are_not_gone() {
        assert!(!local_process_gone(0));
        assert!(!local_process_gone(-5));
    }
}
