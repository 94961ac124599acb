//! The database fails over under load (`chaos db-failover`, see chaos/src/db_failover.rs):
//! a pg_auto_failover cluster in a temporary directory (installed with apt-get if
//! missing), three dltsub instances and a client on it, the primary SIGKILLed mid-run.
//! Nothing accepted may be lost or submitted twice, and the cluster must be gone after.

use std::process::Command;

/// Processes whose command line names one of this harness's cluster directories.
fn cluster_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("dltsub-pgfailover-") {
            found.push(cmdline);
        }
    }
    found
}

#[test]
fn primary_killed_under_load_loses_nothing() {
    let before = cluster_processes();
    let output = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["db-failover"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert_eq!(output.status.code(), Some(0), "{text}");
    // Synchronous replication was on, the fault happened, and nothing was lost.
    assert!(
        text.contains("synchronous_standby_names = \"ANY 1 ("),
        "{text}"
    );
    assert!(
        text.contains("primary node_1 killed") && text.contains("new primary: node_2"),
        "{text}"
    );
    assert!(text.contains("lost (accepted, not final): 0;"), "{text}");
    assert!(text.contains("duplicates 0"), "{text}");
    assert!(
        text.contains("POSTs past the self-fencing deadline with no primary: 0"),
        "{text}"
    );
    // The cluster cleaned up after itself.
    let left: Vec<String> = cluster_processes()
        .into_iter()
        .filter(|process| !before.contains(process))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
}
