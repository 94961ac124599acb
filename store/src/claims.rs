//! The SQL of the claim protocol (DESIGN.md §3). The protocol's policy — fair share, the
//! self-fencing deadline, when to tick — lives in the `dltsub-queuer` crate; this module
//! only reads and writes rows, every time with the database clock.
//!
//! One claim tick is one transaction: heartbeat, read the live instances, renew what I
//! hold, then release and acquire as the caller's plan says. Its statement count does not
//! depend on the number of services.
//!
//! **Pinning.** The plan is per pin group (`pinning.rs`): the tick reads the groups in one
//! statement, and each release or acquisition statement is restricted to one group, run
//! only for groups the plan has something to do in. The takeable rule and the locking are
//! the same in every group.
//!
//! **Takeable claims.** A claim row may be acquired when it is unclaimed, past its slow
//! expiry, or past its fast expiry while no batch of its service is SUBMITTING. On
//! PostgreSQL the candidate rows are locked with `FOR UPDATE SKIP LOCKED`, so concurrent
//! acquirers get disjoint rows without waiting, and a row renewed by its holder between our
//! snapshot and our lock is re-checked against its new expiry. One gap remains at the
//! database level: a holder might mark a batch SUBMITTING after our snapshot and before our
//! lock. That mark is itself refused unless the holder's claim is inside its fast expiry
//! (see `submission.rs`), and a claim is only fast-path takeable past it, so the two cannot
//! both succeed. Release needs no such argument: the tick's renewal has already locked all
//! my rows, so a mark of mine either committed before (and a later statement sees it) or
//! waits for the tick to end.
//!
//! **Gone holders.** The slow expiry exists for a holder that may still be alive — stalled
//! between marking a batch SUBMITTING and its POST — so that a stalled POST has landed or
//! failed before anyone asks the ledger about it. A holder whose process is gone has no
//! such POST left to make. So before acquiring, a tick asks whether the holders of claims
//! past their fast expiry with a batch SUBMITTING still exist (`liveness.rs`: on
//! PostgreSQL, whether any session still carries the holder's `session_tag`; on SQLite, a
//! probe of the holder's process on this host). For the gone ones it moves the slow expiry
//! of their fast-expired claims to now, and the acquisition takes them at once, turning
//! their SUBMITTING batches IN_DOUBT as with any takeover. A dead instance's services thus
//! move after the fast expiry, not the slow one. Holders without a `session_tag` (older
//! versions) are never judged gone.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::dialect::Dialect;
use crate::liveness::StuckHolder;
use crate::pinning::{GROUPS_SQL, GroupRow, Pin, ServiceGroup};
use crate::rows::NewEventRow;
use crate::schema::{batch_statuses, cluster_leases, instances, service_id_claims};
use crate::{BatchStatus, Store, StoreError};

/// Who an instance is, as written in the `instances` registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// `hostname:pid:suffix8`, readable by operators.
    pub instance_id: String,
    pub hostname: String,
    pub pid: i64,
    pub version: String,
    /// Weight in the fair share of services.
    pub capacity: i32,
    /// The `application_name` of every PostgreSQL session of this instance
    /// (`StoreOptions::application_name`), by which other instances tell that its process
    /// is gone. `None`: never judged gone (its claims move only by expiry).
    pub session_tag: Option<String>,
    /// Labels for pinning (`pinning.rs`): services pinned to a label go only to instances
    /// carrying it, services excluding one never to them.
    pub labels: Vec<String>,
}

/// Whether an instance takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Running,
    /// Shutting down: acquires nothing, counts for nobody's fair share.
    Draining,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Running => "running",
            InstanceState::Draining => "draining",
        }
    }
}

/// A live instance as the registry sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveInstance {
    pub instance_id: String,
    pub capacity: i32,
    pub state: InstanceState,
    pub labels: Vec<String>,
}

/// The right to submit one service's batches, at one epoch (the fencing token).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeldClaim {
    pub service_id: String,
    pub epoch: i64,
}

/// How long claims and heartbeats last.
#[derive(Debug, Clone, Copy)]
pub struct ClaimTiming {
    pub fast_expiry: Duration,
    pub slow_expiry: Duration,
    /// An instance whose heartbeat is older than this is not live (not counted in the
    /// fair share; pruned by the leader).
    pub instance_stale_after: Duration,
}

/// What the tick saw before deciding what to release and acquire.
#[derive(Debug, Clone)]
pub struct ClusterView<'a> {
    pub me: &'a str,
    /// Live instances (fresh heartbeat), ordered by id; includes me.
    pub live: &'a [LiveInstance],
    /// All services that have a claim row.
    pub claimable_services: i64,
    /// How many claims I hold after renewal.
    pub held: usize,
    /// The services by pin group, with how many of each I hold (`pinning.rs`).
    pub groups: &'a [ServiceGroup],
}

/// The caller's decision for this tick: what to acquire and release in each pin group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickPlan {
    pub groups: Vec<GroupPlan>,
}

/// The decision for one pin group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupPlan {
    pub pin: Pin,
    /// Acquire at most this many takeable claims of the group.
    pub acquire: usize,
    /// Release this many claims of the group that have no batch mid-submission.
    pub release: usize,
    /// Rotation of the order in which services are tried (see the `shard` column).
    pub order_offset: i64,
}

impl TickPlan {
    /// Acquire up to `acquire` unpinned services, release nothing (for tests and tools).
    pub fn unpinned(acquire: usize) -> Self {
        TickPlan {
            groups: vec![GroupPlan {
                acquire,
                ..GroupPlan::default()
            }],
        }
    }

    /// Claims to acquire over all groups.
    pub fn acquire(&self) -> usize {
        self.groups.iter().map(|group| group.acquire).sum()
    }

    /// Claims to release over all groups.
    pub fn release(&self) -> usize {
        self.groups.iter().map(|group| group.release).sum()
    }
}

/// The outcome of one tick, from the database's point of view.
#[derive(Debug, Clone, Default)]
pub struct TickOutcome {
    /// Everything I hold after the tick, sorted: renewed plus acquired.
    pub held: Vec<HeldClaim>,
    pub acquired: Vec<HeldClaim>,
    /// Service ids released by this tick.
    pub released: Vec<String>,
    pub live: Vec<LiveInstance>,
    pub plan: TickPlan,
    /// The leader lease's epoch if I hold it after the tick.
    pub leader_epoch: Option<i64>,
    /// Batches found SUBMITTING in services just taken over, now IN_DOUBT.
    pub in_doubt: Vec<i64>,
    /// Holders found gone by this tick, whose fast-expired claims became takeable at once.
    pub gone_holders: Vec<String>,
}

/// A claim row as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct ClaimRecord {
    pub service_id: String,
    pub claimant: Option<String>,
    pub epoch: i64,
    pub fast_expiry_us: i64,
    pub slow_expiry_us: i64,
    pub claimed_at_us: Option<i64>,
}

/// The range of the `shard` column: a service's shard is a hash of its id modulo this.
pub const SHARD_RANGE: i64 = 1 << 31;

/// A stable hash of a service id into `0..SHARD_RANGE` (FNV-1a), used to spread the
/// services instances try first.
pub fn service_shard(service_id: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in service_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % SHARD_RANGE as u64) as i64
}

/// The `instances.labels` column as a list.
fn split_labels(text: &str) -> Vec<String> {
    text.split(',')
        .filter(|label| !label.is_empty())
        .map(ToString::to_string)
        .collect()
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

#[derive(QueryableByName)]
struct ClaimRow {
    #[diesel(sql_type = Text)]
    service_id: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
}

impl From<ClaimRow> for HeldClaim {
    fn from(row: ClaimRow) -> Self {
        HeldClaim {
            service_id: row.service_id,
            epoch: row.epoch,
        }
    }
}

#[derive(QueryableByName)]
struct ServiceIdRow {
    #[diesel(sql_type = Text)]
    service_id: String,
}

/// The parameters are written `$1, $2, …` in order of first appearance: PostgreSQL reads
/// them by number and SQLite numbers named parameters in that same order, so one text
/// serves both. `{lock}` is the dialect's row-locking clause.
const ACQUIRE_SQL: &str = "\
UPDATE service_id_claims
   SET claimant = $1, epoch = epoch + 1, fast_expiry_us = $2 + $3, slow_expiry_us = $2 + $4,
       claimed_at_us = $2
 WHERE service_id IN (
       SELECT c.service_id FROM service_id_claims c
        WHERE (c.claimant IS NULL OR c.claimant <> $1)
          AND (c.claimant IS NULL
               OR c.slow_expiry_us <= $2
               OR (c.fast_expiry_us <= $2 AND NOT EXISTS (
                      SELECT 1 FROM batch_statuses b
                       WHERE b.service_id = c.service_id AND b.status = 'SUBMITTING')))
          AND c.service_id IN (
              SELECT s.service_id FROM services s
               WHERE COALESCE(s.pin_label, '') = $5 AND COALESCE(s.exclude_label, '') = $6)
        ORDER BY (c.shard + $7) % 2147483648, c.service_id
        LIMIT $8 {lock})
RETURNING service_id, epoch";

const RENEW_SQL: &str = "\
UPDATE service_id_claims
   SET fast_expiry_us = $1 + $2, slow_expiry_us = $1 + $3
 WHERE service_id IN (
       SELECT service_id FROM service_id_claims
        WHERE claimant = $4
        ORDER BY service_id {lock})
RETURNING service_id, epoch";

/// Releases up to `$4` of my idle claims in the pin group (`$2`, `$3`), e.g. because the
/// group's share went down or I no longer qualify for it.
const RELEASE_IDLE_IN_GROUP_SQL: &str = "\
UPDATE service_id_claims
   SET claimant = NULL, fast_expiry_us = 0, slow_expiry_us = 0
 WHERE service_id IN (
       SELECT c.service_id FROM service_id_claims c
        WHERE c.claimant = $1
          AND c.service_id IN (
              SELECT s.service_id FROM services s
               WHERE COALESCE(s.pin_label, '') = $2 AND COALESCE(s.exclude_label, '') = $3)
          AND NOT EXISTS (
              SELECT 1 FROM batch_statuses b
               WHERE b.service_id = c.service_id AND b.status = 'SUBMITTING')
        ORDER BY c.shard DESC, c.service_id
        LIMIT $4 {lock})
RETURNING service_id";

const RELEASE_IDLE_SQL: &str = "\
UPDATE service_id_claims
   SET claimant = NULL, fast_expiry_us = 0, slow_expiry_us = 0
 WHERE service_id IN (
       SELECT c.service_id FROM service_id_claims c
        WHERE c.claimant = $1
          AND NOT EXISTS (
              SELECT 1 FROM batch_statuses b
               WHERE b.service_id = c.service_id AND b.status = 'SUBMITTING')
        ORDER BY c.shard DESC, c.service_id
        LIMIT $2 {lock})
RETURNING service_id";

/// Holders (other than `$1`) of claims past their fast expiry and not yet their slow one,
/// with a batch SUBMITTING, that can be probed (`session_tag` set).
const STUCK_HOLDERS_SQL: &str = "\
SELECT DISTINCT i.instance_id, i.hostname, i.pid, i.session_tag
  FROM instances i
  JOIN service_id_claims c ON c.claimant = i.instance_id
 WHERE i.instance_id <> $1 AND i.session_tag IS NOT NULL
   AND c.fast_expiry_us <= $2 AND c.slow_expiry_us > $2
   AND EXISTS (SELECT 1 FROM batch_statuses b
                WHERE b.service_id = c.service_id AND b.status = 'SUBMITTING')";

/// Ends the slow window of a gone holder's claims past their fast expiry. The rows are
/// locked in `service_id` order, like renewal does, and a claim the holder renewed after
/// all is left alone (the condition is checked again once the row is locked).
const END_SLOW_WINDOW_SQL: &str = "\
UPDATE service_id_claims
   SET slow_expiry_us = $1
 WHERE service_id IN (
       SELECT service_id FROM service_id_claims
        WHERE claimant = $2 AND fast_expiry_us <= $1 AND slow_expiry_us > $1
        ORDER BY service_id {lock})";

/// The name of the cluster-wide lease whose holder runs the chores.
pub const LEADER_LEASE: &str = "leader";

/// Inside a write transaction: keep or take the named lease for `ttl`; evaluates to the
/// lease epoch if I hold it afterwards. Renewal keeps the epoch; a change of holder bumps
/// it. A macro because it runs inside both the tick's transaction and `try_lease`'s, once
/// per backend.
macro_rules! keep_or_take_lease {
    ($conn:ident, $name:expr, $instance_id:expr, $now_us:expr, $ttl:expr) => {{
        let renewed: Option<i64> = diesel::update(cluster_leases::table)
            .filter(cluster_leases::name.eq($name))
            .filter(cluster_leases::holder.eq($instance_id))
            .set(cluster_leases::expiry_us.eq($now_us + $ttl))
            .returning(cluster_leases::epoch)
            .get_result($conn)
            .await
            .optional()?;
        match renewed {
            Some(epoch) => Some(epoch),
            None => {
                let taken: Option<i64> = diesel::update(cluster_leases::table)
                    .filter(cluster_leases::name.eq($name))
                    .filter(
                        cluster_leases::holder
                            .is_null()
                            .or(cluster_leases::expiry_us.le($now_us)),
                    )
                    .set((
                        cluster_leases::holder.eq($instance_id),
                        cluster_leases::epoch.eq(cluster_leases::epoch + 1),
                        cluster_leases::expiry_us.eq($now_us + $ttl),
                    ))
                    .returning(cluster_leases::epoch)
                    .get_result($conn)
                    .await
                    .optional()?;
                match taken {
                    Some(epoch) => Some(epoch),
                    // The very first lease of a cluster: create its row, held by me.
                    None => diesel::insert_into(cluster_leases::table)
                        .values((
                            cluster_leases::name.eq($name),
                            cluster_leases::holder.eq($instance_id),
                            cluster_leases::epoch.eq(1_i64),
                            cluster_leases::expiry_us.eq($now_us + $ttl),
                        ))
                        .on_conflict_do_nothing()
                        .returning(cluster_leases::epoch)
                        .get_result($conn)
                        .await
                        .optional()?,
                }
            }
        }
    }};
}

impl Store {
    /// One claim tick in one transaction: heartbeat (re-registering me if I was pruned),
    /// read the live instances, renew every claim I hold, let `plan` decide, release idle
    /// claims and acquire takeable ones as planned, and keep or take the leader lease
    /// (for `fast_expiry`). A draining instance renews but neither acquires, nor leads, nor
    /// counts as live.
    pub async fn claim_tick<P>(
        &self,
        me: &InstanceInfo,
        state: InstanceState,
        timing: ClaimTiming,
        plan: P,
    ) -> Result<TickOutcome, StoreError>
    where
        P: FnOnce(&ClusterView<'_>) -> TickPlan + Send,
    {
        let now = self.now();
        let fast = micros(timing.fast_expiry);
        let slow = micros(timing.slow_expiry);
        let stale = micros(timing.instance_stale_after);
        let labels = me.labels.join(",");
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            diesel::insert_into(instances::table)
                .values((
                    instances::instance_id.eq(&me.instance_id),
                    instances::hostname.eq(&me.hostname),
                    instances::pid.eq(me.pid),
                    instances::version.eq(&me.version),
                    instances::capacity.eq(me.capacity),
                    instances::state.eq(state.as_str()),
                    instances::started_at_us.eq(now_us),
                    instances::heartbeat_at_us.eq(now_us),
                    instances::session_tag.eq(&me.session_tag),
                    instances::labels.eq(&labels),
                ))
                .on_conflict(instances::instance_id)
                .do_update()
                .set((
                    instances::heartbeat_at_us.eq(now_us),
                    instances::state.eq(state.as_str()),
                    instances::capacity.eq(me.capacity),
                    instances::labels.eq(&labels),
                ))
                .execute(conn)
                .await?;
            let live: Vec<LiveInstance> = instances::table
                .filter(instances::heartbeat_at_us.gt(now_us - stale))
                .filter(instances::state.eq(InstanceState::Running.as_str()))
                .order(instances::instance_id)
                .select((
                    instances::instance_id,
                    instances::capacity,
                    instances::labels,
                ))
                .load::<(String, i32, String)>(conn)
                .await?
                .into_iter()
                .map(|(instance_id, capacity, labels)| LiveInstance {
                    instance_id,
                    capacity,
                    state: InstanceState::Running,
                    labels: split_labels(&labels),
                })
                .collect();
            // Renewal locks my rows in service_id order, the order fenced writes take their
            // FOR SHARE locks in, so the two never deadlock.
            let sql = RENEW_SQL.replace("{lock}", conn.claim_lock_in_order());
            let mut held: Vec<HeldClaim> = diesel::sql_query(sql)
                .bind::<BigInt, _>(now_us)
                .bind::<BigInt, _>(fast)
                .bind::<BigInt, _>(slow)
                .bind::<Text, _>(&me.instance_id)
                .load::<ClaimRow>(conn)
                .await?
                .into_iter()
                .map(HeldClaim::from)
                .collect();
            // The services by pin group, with my share of each: one statement whatever the
            // number of services.
            let groups: Vec<ServiceGroup> = diesel::sql_query(GROUPS_SQL)
                .bind::<Text, _>(&me.instance_id)
                .load::<GroupRow>(conn)
                .await?
                .into_iter()
                .map(ServiceGroup::from)
                .collect();
            let claimable_services = groups.iter().map(|group| group.services).sum();

            let view = ClusterView {
                me: &me.instance_id,
                live: &live,
                claimable_services,
                held: held.len(),
                groups: &groups,
            };
            let mut plan = plan(&view);
            if state == InstanceState::Draining {
                for group in &mut plan.groups {
                    group.acquire = 0;
                }
            }

            // One release and one acquisition statement per pin group that needs one: the
            // count grows with the distinct pin settings, not with the services.
            let mut released = Vec::new();
            for group in plan.groups.iter().filter(|group| group.release > 0) {
                let (pin_label, exclude_label) = group.pin.sql_key();
                let sql = RELEASE_IDLE_IN_GROUP_SQL.replace("{lock}", conn.row_lock_clause());
                let rows = diesel::sql_query(sql)
                    .bind::<Text, _>(&me.instance_id)
                    .bind::<Text, _>(pin_label)
                    .bind::<Text, _>(exclude_label)
                    .bind::<BigInt, _>(group.release as i64)
                    .load::<ServiceIdRow>(conn)
                    .await?;
                released.extend(rows.into_iter().map(|row| row.service_id));
            }
            if !released.is_empty() {
                held.retain(|claim| !released.contains(&claim.service_id));
            }
            let mut acquired: Vec<HeldClaim> = Vec::new();
            let mut gone_holders = Vec::new();
            if plan.acquire() > 0 {
                let stuck: Vec<StuckHolder> = diesel::sql_query(STUCK_HOLDERS_SQL)
                    .bind::<Text, _>(&me.instance_id)
                    .bind::<BigInt, _>(now_us)
                    .load(conn)
                    .await?;
                if !stuck.is_empty() {
                    gone_holders = conn.gone_holders(&me.hostname, &stuck).await?;
                    let sql = END_SLOW_WINDOW_SQL.replace("{lock}", conn.claim_lock_in_order());
                    for holder in &gone_holders {
                        diesel::sql_query(&sql)
                            .bind::<BigInt, _>(now_us)
                            .bind::<Text, _>(holder)
                            .execute(conn)
                            .await?;
                    }
                }
                let sql = ACQUIRE_SQL.replace("{lock}", conn.row_lock_clause());
                for group in plan.groups.iter().filter(|group| group.acquire > 0) {
                    let (pin_label, exclude_label) = group.pin.sql_key();
                    let rows = diesel::sql_query(&sql)
                        .bind::<Text, _>(&me.instance_id)
                        .bind::<BigInt, _>(now_us)
                        .bind::<BigInt, _>(fast)
                        .bind::<BigInt, _>(slow)
                        .bind::<Text, _>(pin_label)
                        .bind::<Text, _>(exclude_label)
                        .bind::<BigInt, _>(group.order_offset.rem_euclid(SHARD_RANGE))
                        .bind::<BigInt, _>(group.acquire as i64)
                        .load::<ClaimRow>(conn)
                        .await?;
                    acquired.extend(rows.into_iter().map(HeldClaim::from));
                }
                held.extend(acquired.iter().cloned());
            }
            // A takeover inherits whatever the previous holder left mid-submission: its POST
            // may or may not have reached the ledger, so the ledger is asked before anything
            // is resubmitted (DESIGN.md §4).
            let mut in_doubt = Vec::new();
            for chunk in acquired.chunks(1_000) {
                let services: Vec<&str> = chunk.iter().map(|c| c.service_id.as_str()).collect();
                // A run of Unknown answers seen by the previous holder is not evidence for
                // the new one: the grace period starts over with its own polls.
                diesel::update(batch_statuses::table)
                    .filter(batch_statuses::service_id.eq_any(&services))
                    .filter(batch_statuses::unknown_since_us.is_not_null())
                    .set(batch_statuses::unknown_since_us.eq(None::<i64>))
                    .execute(conn)
                    .await?;
                let moved: Vec<(i64, String)> = diesel::update(batch_statuses::table)
                    .filter(batch_statuses::service_id.eq_any(&services))
                    .filter(batch_statuses::status.eq(BatchStatus::Submitting.as_str()))
                    .set((
                        batch_statuses::status.eq(BatchStatus::InDoubt.as_str()),
                        batch_statuses::updated_at_us.eq(now_us),
                    ))
                    .returning((batch_statuses::seq, batch_statuses::service_id))
                    .get_results(conn)
                    .await?;
                in_doubt.extend(moved);
            }
            if !in_doubt.is_empty() {
                let epoch_of: std::collections::HashMap<&str, i64> = acquired
                    .iter()
                    .map(|c| (c.service_id.as_str(), c.epoch))
                    .collect();
                let events: Vec<NewEventRow<'_>> = in_doubt
                    .iter()
                    .map(|(seq, service_id)| NewEventRow {
                        seq: *seq,
                        old_status: Some(BatchStatus::Submitting.as_str()),
                        new_status: BatchStatus::InDoubt.as_str(),
                        epoch: epoch_of.get(service_id.as_str()).copied(),
                        instance_id: Some(&me.instance_id),
                        detail: Some("taken over mid-submission"),
                        at_us: now_us,
                    })
                    .collect();
                conn.insert_events(&events).await?;
            }
            held.sort();
            acquired.sort();
            let leader_epoch = if state == InstanceState::Running {
                keep_or_take_lease!(conn, LEADER_LEASE, &me.instance_id, now_us, fast)
            } else {
                None
            };
            Ok(TickOutcome {
                held,
                acquired,
                released,
                live,
                plan,
                leader_epoch,
                in_doubt: in_doubt.into_iter().map(|(seq, _)| seq).collect(),
                gone_holders,
            })
        })
    }

    /// Hands back every claim of mine with no batch mid-submission, effective at once:
    /// claimant cleared and expiries in the past, so other instances take the services
    /// on their next tick instead of waiting for an expiry. For graceful shutdown, after
    /// in-flight work has drained. Returns the released service ids.
    pub async fn release_idle_claims(&self, instance_id: &str) -> Result<Vec<String>, StoreError> {
        write_transaction!(self, |conn| {
            let sql = RELEASE_IDLE_SQL.replace("{lock}", conn.row_lock_clause());
            let rows = diesel::sql_query(sql)
                .bind::<Text, _>(instance_id)
                .bind::<BigInt, _>(i64::MAX)
                .load::<ServiceIdRow>(conn)
                .await?;
            Ok(rows.into_iter().map(|row| row.service_id).collect())
        })
    }

    /// Removes my row from the registry (graceful shutdown, after releasing claims).
    pub async fn deregister_instance(&self, instance_id: &str) -> Result<(), StoreError> {
        write_transaction!(self, |conn| {
            diesel::delete(instances::table.filter(instances::instance_id.eq(instance_id)))
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    /// Every claim row, by service id.
    pub async fn claims(&self) -> Result<Vec<ClaimRecord>, StoreError> {
        with_conn!(self, |conn| {
            Ok(service_id_claims::table
                .order(service_id_claims::service_id)
                .select((
                    service_id_claims::service_id,
                    service_id_claims::claimant,
                    service_id_claims::epoch,
                    service_id_claims::fast_expiry_us,
                    service_id_claims::slow_expiry_us,
                    service_id_claims::claimed_at_us,
                ))
                .load(conn)
                .await?)
        })
    }

    /// Takes or keeps the named cluster lease (e.g. "leader") for `ttl`. Returns the
    /// lease's epoch if I hold it after the call, `None` if someone else does. Same rules
    /// as service claims: the epoch grows when the holder changes, never on renewal.
    pub async fn try_lease(
        &self,
        name: &str,
        instance_id: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let now = self.now();
        let ttl = micros(ttl);
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            Ok(keep_or_take_lease!(conn, name, instance_id, now_us, ttl))
        })
    }

    /// Gives up a cluster lease I hold (graceful shutdown).
    pub async fn release_lease(&self, name: &str, instance_id: &str) -> Result<(), StoreError> {
        write_transaction!(self, |conn| {
            diesel::update(cluster_leases::table)
                .filter(cluster_leases::name.eq(name))
                .filter(cluster_leases::holder.eq(instance_id))
                .set((
                    cluster_leases::holder.eq(None::<String>),
                    cluster_leases::expiry_us.eq(0),
                ))
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    /// Deletes instances whose heartbeat is older than `stale_after` (a leader chore).
    /// Returns their ids. Their claims are left to expire: only expiry moves a claim.
    pub async fn prune_instances(&self, stale_after: Duration) -> Result<Vec<String>, StoreError> {
        let now = self.now();
        let stale = micros(stale_after);
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            Ok(diesel::delete(
                instances::table.filter(instances::heartbeat_at_us.le(now_us - stale)),
            )
            .returning(instances::instance_id)
            .get_results(conn)
            .await?)
        })
    }

    /// Every registered instance with its heartbeat age in microseconds (for operators).
    pub async fn instances(&self) -> Result<Vec<InstanceRecord>, StoreError> {
        let now = self.now();
        with_conn!(self, |conn| {
            Ok(instances::table
                .order(instances::instance_id)
                .select((
                    instances::instance_id,
                    instances::hostname,
                    instances::pid,
                    instances::version,
                    instances::capacity,
                    instances::state,
                    instances::started_at_us,
                    instances::heartbeat_at_us,
                    instances::labels,
                    now,
                ))
                .load(conn)
                .await?)
        })
    }
}

/// An `instances` row, plus the database clock when it was read.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct InstanceRecord {
    pub instance_id: String,
    pub hostname: String,
    pub pid: i64,
    pub version: String,
    pub capacity: i32,
    pub state: String,
    pub started_at_us: i64,
    pub heartbeat_at_us: i64,
    /// Comma-separated labels (empty: none).
    pub labels: String,
    pub read_at_us: i64,
}
