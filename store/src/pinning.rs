//! Pinning (from Disbatch): instances carry labels, and a service may be pinned to a label
//! (only instances carrying it may hold the service) or exclude one (no instance carrying
//! it may). The services with the same pin and exclusion form a *group*; the claim tick
//! reads the groups with their sizes in one statement, the queuer computes a fair share
//! within each group among the live instances the group admits, and acquisition runs once
//! per group that this instance is short of (`claims.rs`), so the statement count of a tick
//! grows with the number of distinct pin settings, never with the number of services.
//!
//! Labels are short lowercase words (`[a-z0-9][a-z0-9.-]*`, at most 63 bytes): they hold
//! no LIKE wildcard and no comma, so `',' || labels || ','` LIKE `'%,' || label || ',%'`
//! is an exact membership test that reads the same on both backends (SQLite's LIKE ignores
//! ASCII case, hence lowercase only).

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::schema::services;
use crate::{Store, StoreError};

/// Longest label.
pub const MAX_LABEL_LEN: usize = 63;

/// Whether `text` is a valid label.
pub fn is_label(text: &str) -> bool {
    let mut bytes = text.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'0'..=b'9'))
        && text.len() <= MAX_LABEL_LEN
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-'))
}

/// Parses a comma-separated label list ("gpu,eu-west"; blanks around commas ignored,
/// duplicates dropped). Empty text: no labels.
pub fn parse_labels(text: &str) -> Result<Vec<String>, String> {
    let mut labels: Vec<String> = Vec::new();
    for part in text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        if !is_label(part) {
            return Err(format!(
                "{part:?} is not a label: lowercase letters, digits, '.' and '-', starting with a letter or digit, at most {MAX_LABEL_LEN} bytes"
            ));
        }
        if !labels.iter().any(|label| label == part) {
            labels.push(part.to_string());
        }
    }
    Ok(labels)
}

/// A service's pin and exclusion: the key of its group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pin {
    /// Only instances carrying this label may hold the service; `None`: any.
    pub pin_label: Option<String>,
    /// No instance carrying this label may hold the service; `None`: none excluded.
    pub exclude_label: Option<String>,
}

impl Pin {
    /// Whether an instance with these labels may hold services of this group.
    pub fn admits(&self, labels: &[String]) -> bool {
        let has = |wanted: &String| labels.iter().any(|label| label == wanted);
        self.pin_label.as_ref().is_none_or(has) && !self.exclude_label.as_ref().is_some_and(has)
    }

    /// Whether anything restricts the group (unpinned services are the default group).
    pub fn is_restricted(&self) -> bool {
        self.pin_label.is_some() || self.exclude_label.is_some()
    }

    /// The group key as the SQL compares it: `''` stands for "none" (labels are never
    /// empty).
    pub(crate) fn sql_key(&self) -> (&str, &str) {
        (
            self.pin_label.as_deref().unwrap_or(""),
            self.exclude_label.as_deref().unwrap_or(""),
        )
    }

    fn validate(&self) -> Result<(), StoreError> {
        for (field, label) in [
            ("pin_label", &self.pin_label),
            ("exclude_label", &self.exclude_label),
        ] {
            if let Some(label) = label
                && !is_label(label)
            {
                return Err(StoreError::InvalidInput {
                    field,
                    problem: format!(
                        "{label:?} is not a label: lowercase letters, digits, '.' and '-', starting with a letter or digit, at most {MAX_LABEL_LEN} bytes"
                    ),
                });
            }
        }
        if self.pin_label.is_some() && self.pin_label == self.exclude_label {
            return Err(StoreError::InvalidInput {
                field: "exclude_label",
                problem: "a service cannot be pinned to the label it excludes".into(),
            });
        }
        Ok(())
    }
}

/// One group of services (same pin and exclusion) as a claim tick sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceGroup {
    pub pin: Pin,
    /// Services of the group that have a claim row.
    pub services: i64,
    /// How many of them the ticking instance holds (after renewal).
    pub held: i64,
}

/// The groups with their sizes and my holdings; `$1` is my instance id. Every claim row
/// has its service row (enqueue writes both in one transaction, and a foreign key holds
/// it), so the inner join loses nothing.
pub(crate) const GROUPS_SQL: &str = "\
SELECT COALESCE(s.pin_label, '') AS pin_label, COALESCE(s.exclude_label, '') AS exclude_label,
       COUNT(*) AS services, SUM(CASE WHEN c.claimant = $1 THEN 1 ELSE 0 END) AS held
  FROM service_id_claims c JOIN services s ON s.service_id = c.service_id
 GROUP BY COALESCE(s.pin_label, ''), COALESCE(s.exclude_label, '')";

#[derive(QueryableByName)]
pub(crate) struct GroupRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pin_label: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    exclude_label: String,
    #[diesel(sql_type = BigInt)]
    services: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    held: Option<i64>,
}

impl From<GroupRow> for ServiceGroup {
    fn from(row: GroupRow) -> Self {
        let none_if_empty = |text: String| (!text.is_empty()).then_some(text);
        ServiceGroup {
            pin: Pin {
                pin_label: none_if_empty(row.pin_label),
                exclude_label: none_if_empty(row.exclude_label),
            },
            services: row.services,
            held: row.held.unwrap_or(0),
        }
    }
}

/// The membership test of a label (`{label}`, an SQL expression) in the labels of the
/// instance aliased `i`.
fn has_label(label: &str) -> String {
    format!("(',' || i.labels || ',') LIKE ('%,' || {label} || ',%')")
}

/// Pinned or excluding services that no live instance may hold. `$1`: the heartbeat
/// threshold (now − stale) in microseconds.
fn unserved_sql() -> String {
    format!(
        "\
SELECT COUNT(*) AS services
  FROM services s
 WHERE (s.pin_label IS NOT NULL OR s.exclude_label IS NOT NULL)
   AND NOT EXISTS (
       SELECT 1 FROM instances i
        WHERE i.state = 'running' AND i.heartbeat_at_us > $1
          AND (s.pin_label IS NULL OR {pinned})
          AND (s.exclude_label IS NULL OR NOT {excluded}))",
        pinned = has_label("s.pin_label"),
        excluded = has_label("s.exclude_label"),
    )
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    services: i64,
}

impl Store {
    /// Sets a service's pin and exclusion (`Pin::default()` clears both). The holder
    /// releases the service on its next tick if it no longer qualifies (once nothing of it
    /// is mid-submission), and an instance that does takes it. `false` if there is no such
    /// service.
    pub async fn set_service_pin(&self, service_id: &str, pin: &Pin) -> Result<bool, StoreError> {
        pin.validate()?;
        let changed = write_transaction!(self, |conn| {
            Ok(diesel::update(services::table.find(service_id))
                .set((
                    services::pin_label.eq(pin.pin_label.as_deref()),
                    services::exclude_label.eq(pin.exclude_label.as_deref()),
                ))
                .execute(conn)
                .await?)
        })?;
        Ok(changed == 1)
    }

    /// Services pinned to a label (or excluding one) that no live instance may hold:
    /// running, heartbeat newer than `stale_after` by the database clock. Cluster-wide.
    pub async fn unserved_services(
        &self,
        stale_after: std::time::Duration,
    ) -> Result<i64, StoreError> {
        let now = self.now();
        let stale = i64::try_from(stale_after.as_micros()).unwrap_or(i64::MAX);
        let sql = unserved_sql();
        with_conn!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let row: CountRow = diesel::sql_query(&sql)
                .bind::<BigInt, _>(now_us.saturating_sub(stale))
                .get_result(conn)
                .await?;
            Ok(row.services)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(list: &[&str]) -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn labels_parse_and_validate() {
        assert_eq!(
            parse_labels(" gpu, eu-west ,gpu,").unwrap(),
            labels(&["gpu", "eu-west"])
        );
        assert_eq!(parse_labels("").unwrap(), Vec::<String>::new());
        for bad in ["GPU", "a_b", "a%", "-x", "a b", &"x".repeat(64)] {
            assert!(parse_labels(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pin_admits_by_pin_and_exclusion() {
        let pin = |p: Option<&str>, e: Option<&str>| Pin {
            pin_label: p.map(Into::into),
            exclude_label: e.map(Into::into),
        };
        assert!(pin(None, None).admits(&[]));
        assert!(pin(Some("gpu"), None).admits(&labels(&["eu", "gpu"])));
        assert!(!pin(Some("gpu"), None).admits(&labels(&["eu"])));
        assert!(!pin(None, Some("eu")).admits(&labels(&["eu"])));
        assert!(pin(None, Some("eu")).admits(&labels(&["us"])));
        assert!(!pin(Some("gpu"), Some("eu")).admits(&labels(&["gpu", "eu"])));
    }
}
