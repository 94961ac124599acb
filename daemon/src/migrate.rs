//! `dltsub migrate`: apply the embedded schema to the configured database.

use anyhow::Context;

use crate::config::Config;

pub async fn run(config: &Config) -> anyhow::Result<()> {
    let options = config.store_options();
    let report = dltsub_store::run_migrations(&options)
        .await
        .with_context(|| format!("migrating {}", options.url))?;
    let backend = options.url.backend_name();
    if report.applied.is_empty() {
        println!(
            "{backend} schema at {} is up to date ({} migrations)",
            options.url, report.known
        );
    } else {
        println!(
            "applied {} of {} migrations to {backend} database {}: {}",
            report.applied.len(),
            report.known,
            options.url,
            report.applied.join(", ")
        );
    }
    Ok(())
}
