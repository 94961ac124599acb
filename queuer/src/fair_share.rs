//! How many services an instance should hold (from the Logstash cluster plan): a share of
//! all services proportional to its capacity among the live instances, rounded up so the
//! shares always cover every service.
//!
//! With pinning (DESIGN.md §3, `dltsub_store::Pin`) the share is computed within each pin
//! group: the services of a group are shared among the live instances the group admits,
//! and an instance the group does not admit has a share of zero there (so it releases
//! whatever it still holds of it). A group no live instance admits is unserved; the
//! `dltsub_services_unserved` gauge reports it.

use dltsub_store::{ClusterView, GroupPlan, LiveInstance, SHARD_RANGE, ServiceGroup, TickPlan};

/// `ceil(services × my_capacity / capacity of the instances sharing them)`, 0 if I am not
/// among them.
fn share_among(services: i64, me: &str, sharing: &[&LiveInstance]) -> usize {
    let capacity: i64 = sharing.iter().map(|i| i64::from(i.capacity.max(1))).sum();
    let Some(mine) = sharing.iter().find(|i| i.instance_id == me) else {
        return 0;
    };
    if capacity == 0 || services <= 0 {
        return 0;
    }
    let numerator = services * i64::from(mine.capacity.max(1));
    usize::try_from((numerator + capacity - 1) / capacity).unwrap_or(usize::MAX)
}

/// The live instances a group admits, in the live list's order (by id).
fn admitted<'a>(view: &'a ClusterView<'_>, group: &ServiceGroup) -> Vec<&'a LiveInstance> {
    view.live
        .iter()
        .filter(|instance| group.pin.admits(&instance.labels))
        .collect()
}

/// My share of one group.
pub fn group_share(view: &ClusterView<'_>, group: &ServiceGroup) -> usize {
    share_among(group.services, view.me, &admitted(view, group))
}

/// This instance's fair share over every group.
pub fn fair_share(view: &ClusterView<'_>) -> usize {
    view.groups
        .iter()
        .map(|group| group_share(view, group))
        .sum()
}

/// The tick's plan, per group: acquire up to the share, release what is above it (only
/// idle claims are ever released, by the store), and start looking for services at an
/// offset given by my position among the instances the group admits, so they reach for
/// different rows first.
pub fn plan(view: &ClusterView<'_>) -> TickPlan {
    let groups = view
        .groups
        .iter()
        .map(|group| {
            let sharing = admitted(view, group);
            let share = share_among(group.services, view.me, &sharing);
            let held = usize::try_from(group.held).unwrap_or(0);
            let position = sharing
                .iter()
                .position(|i| i.instance_id == view.me)
                .unwrap_or(0) as i64;
            let count = sharing.len().max(1) as i64;
            GroupPlan {
                pin: group.pin.clone(),
                acquire: share.saturating_sub(held),
                release: held.saturating_sub(share),
                order_offset: position * (SHARD_RANGE / count),
            }
        })
        .filter(|group| group.acquire > 0 || group.release > 0)
        .collect();
    TickPlan { groups }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dltsub_store::{InstanceState, Pin};

    fn live(capacities: &[i32]) -> Vec<LiveInstance> {
        capacities
            .iter()
            .enumerate()
            .map(|(n, capacity)| LiveInstance {
                instance_id: format!("i{n}"),
                capacity: *capacity,
                state: InstanceState::Running,
                labels: Vec::new(),
            })
            .collect()
    }

    fn unpinned(services: i64, held: usize) -> Vec<ServiceGroup> {
        vec![ServiceGroup {
            pin: Pin::default(),
            services,
            held: held as i64,
        }]
    }

    fn view<'a>(
        me: &'a str,
        live: &'a [LiveInstance],
        groups: &'a [ServiceGroup],
    ) -> ClusterView<'a> {
        ClusterView {
            me,
            live,
            claimable_services: groups.iter().map(|g| g.services).sum(),
            held: groups.iter().map(|g| g.held as usize).sum(),
            groups,
        }
    }

    #[test]
    fn equal_capacities_split_evenly_rounding_up() {
        let live = live(&[1, 1, 1]);
        assert_eq!(fair_share(&view("i0", &live, &unpinned(300, 0))), 100);
        assert_eq!(fair_share(&view("i0", &live, &unpinned(301, 0))), 101);
        assert_eq!(fair_share(&view("i2", &live, &unpinned(2, 0))), 1);
    }

    #[test]
    fn capacity_weights_the_share() {
        let live = live(&[300, 100]);
        assert_eq!(fair_share(&view("i0", &live, &unpinned(400, 0))), 300);
        assert_eq!(fair_share(&view("i1", &live, &unpinned(400, 0))), 100);
    }

    #[test]
    fn plan_acquires_up_to_share_and_releases_excess() {
        let live = live(&[1, 1, 1, 1]);
        let plan_new = plan(&view("i3", &live, &unpinned(300, 0)));
        assert_eq!((plan_new.acquire(), plan_new.release()), (75, 0));
        let plan_old = plan(&view("i0", &live, &unpinned(300, 100)));
        assert_eq!((plan_old.acquire(), plan_old.release()), (0, 25));
        assert_ne!(
            plan_new.groups[0].order_offset,
            plan_old.groups[0].order_offset
        );
    }

    #[test]
    fn not_live_means_no_share() {
        let live = live(&[1]);
        let plan = plan(&view("draining", &live, &unpinned(10, 4)));
        assert_eq!((plan.acquire(), plan.release()), (0, 4));
    }

    /// Each group is shared among the instances it admits: 100 gpu-pinned services go to
    /// the two gpu instances only, 90 unpinned ones to all three, and 30 services that
    /// exclude "eu" to the one instance without it.
    #[test]
    fn shares_are_computed_within_each_pin_group() {
        let mut live = live(&[1, 1, 1]);
        live[0].labels = vec!["gpu".into(), "eu".into()];
        live[1].labels = vec!["gpu".into(), "eu".into()];
        let pinned = |pin: Option<&str>, exclude: Option<&str>, services| ServiceGroup {
            pin: Pin {
                pin_label: pin.map(Into::into),
                exclude_label: exclude.map(Into::into),
            },
            services,
            held: 0,
        };
        let groups = vec![
            pinned(Some("gpu"), None, 100),
            pinned(None, None, 90),
            pinned(None, Some("eu"), 30),
        ];
        let shares = |me| {
            let view = view(me, &live, &groups);
            groups
                .iter()
                .map(|group| group_share(&view, group))
                .collect::<Vec<_>>()
        };
        assert_eq!(shares("i0"), vec![50, 30, 0]);
        assert_eq!(shares("i1"), vec![50, 30, 0]);
        assert_eq!(shares("i2"), vec![0, 30, 30]);

        // An instance holding services of a group it no longer qualifies for releases them.
        let mut held = groups.clone();
        held[0].held = 7;
        let plan = plan(&view("i2", &live, &held));
        let gpu = plan
            .groups
            .iter()
            .find(|group| group.pin.pin_label.as_deref() == Some("gpu"))
            .unwrap();
        assert_eq!((gpu.acquire, gpu.release), (0, 7));
    }
}
