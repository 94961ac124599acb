//! A TOML configuration file's text to a validated `Config` (`Config::from_toml_str`, what
//! `--config FILE` reads): never a panic, every error one line (README, "Configuration"),
//! and an accepted configuration keeps the rules between keys and renders one line a key.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use dltsub::config::Config;
use libfuzzer_sys::fuzz_target;

fn keys() -> usize {
    static KEYS: OnceLock<usize> = OnceLock::new();
    *KEYS.get_or_init(|| {
        Config::from_toml_str("", Path::new("dltsub.toml"))
            .expect("the defaults are valid")
            .render()
            .lines()
            .count()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml_str(text, Path::new("dltsub.toml")) {
        Ok(config) => {
            assert!(config.fast_expiry < config.slow_expiry);
            assert!(config.renew_interval <= config.fast_expiry / 3);
            assert!(config.idle_in_transaction_timeout <= config.fast_expiry);
            assert!(config.dlt_request_timeout <= config.slow_expiry - config.fast_expiry);
            assert!(config.unknown_grace >= config.dlt_request_timeout);
            assert!(config.retry_backoff_base <= config.retry_backoff_max);
            assert!(config.database_pool_size >= 1 && config.instance_capacity >= 1);
            let rendered = config.render();
            assert_eq!(rendered.lines().count(), keys(), "{rendered}");
            let _ = config.store_options();
        }
        Err(error) => {
            let message = error.to_string();
            assert!(!message.contains(['\n', '\r']), "{message:?}");
        }
    }
});
