//! Who this process is in the `instances` registry.

use dltsub_store::InstanceInfo;

/// Builds this process's registry entry: `hostname:pid:suffix8`, readable by operators
/// and unique even when a pid is reused after a restart. Its session tag
/// (`dltsub:pid:suffix8`, well inside PostgreSQL's 63-byte `application_name`) marks its
/// database sessions, by which other instances tell that it is gone.
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
        session_tag: Some(format!("dltsub:{pid}:{}", &suffix[..8])),
        labels: Vec::new(),
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
        let tag = a.session_tag.unwrap();
        assert_eq!(tag, format!("dltsub:{}:{}", parts[1], parts[2]));
        assert!(tag.len() < 64, "fits application_name");
    }
}
