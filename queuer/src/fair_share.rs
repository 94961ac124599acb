//! How many services an instance should hold (from the Logstash cluster plan): a share of
//! all services proportional to its capacity among the live instances, rounded up so the
//! shares always cover every service.

use dltsub_store::{ClusterView, SHARD_RANGE, TickPlan};

/// This instance's fair share: `ceil(services × my_capacity / live_capacity)`.
pub fn fair_share(view: &ClusterView<'_>) -> usize {
    let live_capacity: i64 = view.live.iter().map(|i| i64::from(i.capacity.max(1))).sum();
    let Some(me) = view.live.iter().find(|i| i.instance_id == view.me) else {
        // Not live (draining, or registered but not yet visible): no share.
        return 0;
    };
    if live_capacity == 0 || view.claimable_services <= 0 {
        return 0;
    }
    let numerator = view.claimable_services * i64::from(me.capacity.max(1));
    usize::try_from((numerator + live_capacity - 1) / live_capacity).unwrap_or(usize::MAX)
}

/// The tick's plan: acquire up to the share, release what is above it (only idle claims
/// are ever released, by the store), and start looking for services at an offset given by
/// my position among the live instances, so instances reach for different rows first.
pub fn plan(view: &ClusterView<'_>) -> TickPlan {
    let share = fair_share(view);
    let position = view
        .live
        .iter()
        .position(|i| i.instance_id == view.me)
        .unwrap_or(0) as i64;
    let live = view.live.len().max(1) as i64;
    TickPlan {
        acquire: share.saturating_sub(view.held),
        release: view.held.saturating_sub(share),
        order_offset: position * (SHARD_RANGE / live),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dltsub_store::{InstanceState, LiveInstance};

    fn live(capacities: &[i32]) -> Vec<LiveInstance> {
        capacities
            .iter()
            .enumerate()
            .map(|(n, capacity)| LiveInstance {
                instance_id: format!("i{n}"),
                capacity: *capacity,
                state: InstanceState::Running,
            })
            .collect()
    }

    fn view<'a>(
        me: &'a str,
        live: &'a [LiveInstance],
        services: i64,
        held: usize,
    ) -> ClusterView<'a> {
        ClusterView {
            me,
            live,
            claimable_services: services,
            held,
        }
    }

    #[test]
    fn equal_capacities_split_evenly_rounding_up() {
        let live = live(&[1, 1, 1]);
        assert_eq!(fair_share(&view("i0", &live, 300, 0)), 100);
        assert_eq!(fair_share(&view("i0", &live, 301, 0)), 101);
        assert_eq!(fair_share(&view("i2", &live, 2, 0)), 1);
    }

    #[test]
    fn capacity_weights_the_share() {
        let live = live(&[300, 100]);
        assert_eq!(fair_share(&view("i0", &live, 400, 0)), 300);
        assert_eq!(fair_share(&view("i1", &live, 400, 0)), 100);
    }

    #[test]
    fn plan_acquires_up_to_share_and_releases_excess() {
        let live = live(&[1, 1, 1, 1]);
        let plan_new = plan(&view("i3", &live, 300, 0));
        assert_eq!((plan_new.acquire, plan_new.release), (75, 0));
        let plan_old = plan(&view("i0", &live, 300, 100));
        assert_eq!((plan_old.acquire, plan_old.release), (0, 25));
        assert_ne!(plan_new.order_offset, plan_old.order_offset);
    }

    #[test]
    fn not_live_means_no_share() {
        let live = live(&[1]);
        let plan = plan(&view("draining", &live, 10, 4));
        assert_eq!((plan.acquire, plan.release), (0, 4));
    }
}
