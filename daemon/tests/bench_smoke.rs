//! `dltsub bench all` in its smallest configuration, so the benchmark cannot rot: it must
//! complete and print the table with a row for every measurement. No figure is asserted
//! (figures come from commands, not from tests; see BENCHMARKS.md).

use std::process::Command;
use std::time::Instant;

#[test]
fn bench_all_smoke_prints_every_row() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["bench", "all"])
        .args(["--batches", "200", "--services", "10", "--instances", "1,2"])
        .args(["--max-in-flight", "1"])
        .args(["--ingest-duration", "1s", "--ingest-clients", "4"])
        .args(["--ingest-batches-per-list", "10"])
        .args(["--latency-rate", "100", "--latency-duration", "1s"])
        .args(["--latency-services", "10", "--latency-commit", "0ms"])
        .args(["--failover", "short"])
        .args(["--claim-services", "100", "--claim-rounds", "3"])
        .args(["--no-peers", "--pgbench-duration", "1s"])
        .env_remove("DLTSUB_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}\nbench all smoke took {:.1?}", started.elapsed());

    let row = |section: &str, case: &str| {
        stdout
            .lines()
            .any(|line| line.split_whitespace().next() == Some(section) && line.contains(case))
    };
    for (section, case) in [
        ("drain", "postgres, 1 instance "),
        ("drain", "postgres, 2 instances"),
        ("drain", "sqlite, 1 instance "),
        ("drain", "sqlite, 2 instances"),
        ("memory", "postgres, peak RSS of one instance"),
        ("memory", "sqlite, peak RSS of one instance"),
        ("ingest", "postgres, 4 clients, 10 batches/list"),
        ("ingest", "sqlite, 4 clients, 10 batches/list"),
        ("latency", "postgres, ledger commit 0 ms"),
        ("latency", "sqlite, ledger commit 0 ms"),
        ("failover", "postgres after SIGKILL, short expiries"),
        ("failover", "postgres after SIGSTOP, short expiries"),
        ("claims", "postgres, 100 services, 4 instances"),
        ("claims", "sqlite, 100 services, 4 instances"),
        ("peers", "pgqueuer"),
        ("peers", "graphile-worker"),
        ("peers", "pgbench single-row UPDATE"),
        ("peers", "pgbench -N"),
        ("summary", "goal: drain >= fastest peer"),
        ("summary", "goal: SIGKILL failover"),
    ] {
        assert!(
            row(section, case),
            "no {section} row {case:?} in:\n{stdout}"
        );
    }
    assert!(stdout.contains("machine: "), "{stdout}");
}
