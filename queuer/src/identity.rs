//! Who this process is in the `instances` registry.

use dltsub_store::InstanceInfo;

/// Builds this process's registry entry: `hostname:pid:suffix8`, readable by operators
/// and unique even when a pid is reused after a restart.
pub fn this_instance(capacity: i32) -> InstanceInfo {
    let hostname = hostname();
    let pid = std::process::id();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    InstanceInfo {
        instance_id: format!("{hostname}:{pid}:{}", &suffix[..8]),
        hostname,
        pid: i64::from(pid),
        version: env!("CARGO_PKG_VERSION").to_string(),
        capacity,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_host_and_pid_and_differ() {
        let a = this_instance(1);
        let b = this_instance(1);
        assert_ne!(a.instance_id, b.instance_id);
        let parts: Vec<&str> = a.instance_id.split(':').collect();
        assert_eq!(parts.len(), 3, "{}", a.instance_id);
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2].len(), 8);
    }
}
