//! `dltsub demo`, the README's first command, as a newcomer runs it (smaller): it must
//! kill an instance, see its services move, and find nothing lost or duplicated.

use std::process::Command;

fn value<'a>(summary: &'a str, label: &str) -> &'a str {
    summary
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in the summary:\n{summary}"))
        .trim()
}

#[test]
fn demo_kills_an_instance_and_loses_nothing() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args([
            "demo",
            "--services",
            "6",
            "--batches",
            "300",
            "--rate",
            "100",
        ])
        .env_remove("DLTSUB_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");

    assert_eq!(value(&stdout, "batches accepted by dltsub"), "300");
    assert_eq!(value(&stdout, "lost"), "0");
    assert_eq!(value(&stdout, "duplicates seen by the ledger"), "0");
    assert_eq!(value(&stdout, "services out of order"), "0");
    let committed: u64 = value(&stdout, "committed (dltsub)").parse().unwrap();
    let on_ledger: u64 = value(&stdout, "committed (on the ledger)").parse().unwrap();
    assert_eq!(committed, on_ledger);
    // Every 50th batch is made invalid: 6 of 300, recorded by both sides.
    assert_eq!(value(&stdout, "invalid (dltsub / ledger)"), "6 / 6");
    assert_eq!(committed + 6, 300);
    // The kill happened and the dead instance's services found a new holder.
    let killed = value(&stdout, "instance killed (SIGKILL)");
    assert!(killed.contains(" at "), "{killed}");
    let moved = value(&stdout, "its services moved after");
    let seconds: f64 = moved
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no takeover time in {moved:?}"));
    // The victim held services: the kill waits for claims, and their takeover waits for
    // at least what was left of the claims' fast expiry (3 s, renewed every second).
    let services: u32 = moved
        .split_once('(')
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no service count in {moved:?}"));
    assert!(
        services >= 1,
        "the killed instance held no service: {moved}"
    );
    assert!(
        (0.5..15.0).contains(&seconds),
        "takeover took {seconds}s: {moved}"
    );
    // The survivors were stopped with SIGTERM and exited cleanly.
    let others = value(&stdout, "other instances (SIGTERM)");
    assert_eq!(others.matches("exited 0").count(), 2, "{others}");
    assert!(
        stderr.contains("with SIGKILL at") && stderr.contains("have new holders"),
        "progress shows the kill:\n{stderr}"
    );
    assert!(stdout.contains("nothing lost, nothing duplicated, every service in order"));
}

#[test]
fn demo_refuses_bad_options() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["demo", "--services", "1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--services must be at least 3"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["demo", "--clients", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--clients must be between 1 and 64"),
        "{stderr}"
    );
}
