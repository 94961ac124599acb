//! What `deploy/` ships is valid and true to the code: Prometheus's own checker accepts the
//! scrape configuration and the rules, `promtool test rules` passes every alert's unit
//! test (firing and not firing), every `dltsub_` metric name and label value that the
//! rules, their tests, the dashboard and the runbook use is one dltsub exports (so a metric
//! or label renamed in the code without updating them fails here), HAProxy accepts its
//! configuration, and dltsub accepts the example configuration file.
//!
//! promtool and haproxy come from Debian's `prometheus` and `haproxy` packages, which
//! `scripts/setup-deploy-tools` (called by `scripts/test`) installs; a missing tool is a
//! failure, not a skip.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dltsub::metrics::{Kind, catalogue};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no *.{extension} in {}", dir.display());
    found
}

/// Runs a deploy tool; a missing one fails with the way to install it.
fn tool(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|error| {
            panic!("cannot run {program} ({error}); scripts/setup-deploy-tools installs it")
        })
}

fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_accepts_the_scrape_config_and_the_rules() {
    let dir = deploy().join("prometheus");
    let output = tool("promtool", &["check", "config", "prometheus.yml"], &dir);
    assert_success("promtool check config prometheus.yml", &output);
    for rules in files(&dir.join("rules"), "yml") {
        let path = rules.to_str().unwrap();
        let output = tool("promtool", &["check", "rules", path], &dir);
        assert_success(&format!("promtool check rules {path}"), &output);
    }
}

/// Every alert has a unit test that makes it fire and one that keeps it quiet.
#[test]
fn promtool_unit_tests_pass_and_cover_every_alert() {
    let dir = deploy().join("prometheus");
    let tests = files(&dir.join("tests"), "yml");
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(|path| path.to_str().unwrap()));
    let output = tool("promtool", &args, &dir);
    assert_success("promtool test rules", &output);

    let alerts: BTreeSet<String> = files(&dir.join("rules"), "yml")
        .iter()
        .flat_map(|path| values_of(&read(path), "- alert:"))
        .collect();
    assert!(alerts.len() >= 8, "alerts found: {alerts:?}");
    let tests_text: String = tests.iter().map(|path| read(path)).collect();
    for alert in &alerts {
        // `alertname: X` followed (before the next test case) by a non-empty and by an
        // empty `exp_alerts`.
        let cases: Vec<&str> = tests_text
            .split("- eval_time:")
            .filter(|case| values_of(case, "alertname:").iter().any(|a| a == alert))
            .collect();
        assert!(
            cases.iter().any(|case| case.contains("exp_labels:")),
            "no unit test makes {alert} fire"
        );
        assert!(
            cases.iter().any(|case| case.contains("exp_alerts: []")),
            "no unit test keeps {alert} quiet"
        );
    }
}

/// The rules, their tests, the dashboard and the runbook name only metrics and label
/// values that dltsub exports ([`dltsub::metrics::catalogue`] is built from the constants
/// the code records them under).
#[test]
fn deploy_files_use_only_metrics_dltsub_exports() {
    let root = deploy();
    let mut checked = files(&root.join("prometheus/rules"), "yml");
    checked.extend(files(&root.join("prometheus/tests"), "yml"));
    checked.extend(files(&root.join("grafana"), "json"));
    checked.push(root.join("README.md"));
    let families = catalogue();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for path in &checked {
        // JSON escapes the quotes of label values.
        let text = read(path).replace("\\\"", "\"");
        for (name, matchers) in metric_references(&text) {
            let family = families.iter().find(|family| {
                family.name == name
                    || (family.kind == Kind::Histogram
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| name == format!("{}{suffix}", family.name)))
            });
            let Some(family) = family else {
                problems.push(format!("{}: {name} is not a dltsub metric", path.display()));
                continue;
            };
            used.insert(family.name);
            for (label, value) in matchers {
                if ["job", "instance", "le"].contains(&label.as_str()) {
                    continue;
                }
                let Some((_, values)) = family.labels.iter().find(|(l, _)| *l == label) else {
                    problems.push(format!("{}: {name} has no label {label:?}", path.display()));
                    continue;
                };
                for alternative in value.split('|').filter(|v| !v.is_empty()) {
                    let is_regex = alternative.contains(['.', '*', '+', '?', '(', '[', '\\']);
                    if !is_regex && !values.contains(&alternative) {
                        problems.push(format!(
                            "{}: {name}{{{label}={alternative:?}}} is never exported (values: {values:?})",
                            path.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The alerts of the issue are built on these; losing one of them means a rule lost its
    // input.
    for needed in [
        "dltsub_services_unclaimed_seconds",
        "dltsub_batches_oldest_seconds",
        "dltsub_submissions_total",
        "dltsub_batches",
        "dltsub_claims_held",
    ] {
        assert!(used.contains(needed), "no deploy file uses {needed}");
    }
}

#[test]
fn haproxy_accepts_its_configuration() {
    let dir = deploy().join("haproxy");
    let output = tool("haproxy", &["-c", "-f", "haproxy.cfg"], &dir);
    assert_success("haproxy -c -f haproxy.cfg", &output);
}

#[test]
fn dltsub_accepts_the_example_configuration() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["config", "--config"])
        .arg(deploy().join("dltsub.toml"))
        .env_remove("DLTSUB_CONFIG")
        .output()
        .unwrap();
    assert_success("dltsub config --config deploy/dltsub.toml", &output);
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("shutdown_delay = \"5s\""),
        "the example sets a shutdown delay for the balancer:\n{shown}"
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The values after `key` on each line that has it (`- alert: X` → `X`).
fn values_of(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix(key))
        .map(|value| value.trim().trim_matches(['"', '\'']).to_string())
        .collect()
}

/// Every `dltsub_…` metric name in `text` with the equality and regex matchers written
/// right after it (`name{label="v"}`, `=~"a|b"`). Names of recording rules
/// (`job:dltsub_…:max`) are not metrics and are skipped.
fn metric_references(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let bytes = text.as_bytes();
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find("dltsub_") {
        let start = at + offset;
        let mut end = start;
        while end < bytes.len() && is_name(bytes[end]) {
            end += 1;
        }
        at = end.max(start + 1);
        let name = &text[start..end];
        let preceded = start > 0 && is_name(bytes[start - 1]);
        if preceded || name.contains(':') || name == "dltsub_" {
            continue;
        }
        let mut matchers = Vec::new();
        if bytes.get(end) == Some(&b'{')
            && let Some(close) = text[end..].find('}')
        {
            for matcher in text[end + 1..end + close].split(',') {
                let Some((label, value)) = matcher.split_once('=') else {
                    continue;
                };
                let label = label.trim().trim_end_matches('!');
                let value = value.trim_start_matches('~').trim();
                if matcher.contains("!=") || matcher.contains("!~") {
                    continue;
                }
                matchers.push((label.to_string(), value.trim_matches('"').to_string()));
            }
        }
        found.push((name.to_string(), matchers));
    }
    found
}
