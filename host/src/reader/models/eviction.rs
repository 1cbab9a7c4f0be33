//! Which resident models to unload so that another fits the memory budget (docs/models.md,
//! "Eviction"). A pure choice over a snapshot of the residents, decided *before* the new model's
//! sidecar starts, so memory is never over-committed while it loads.
//!
//! Only idle models are candidates: not pinned, no read in flight. Among them, in least recently
//! used order:
//!
//! 1. the coldest model that frees enough alone (one eviction of a large cold model beats three
//!    small ones, and fewer reloads follow);
//! 2. else models coldest first until enough is free.
//!
//! When even every idle model is not enough, the answer says whether waiting can help (busy
//! models will become idle) or never will (the pinned models and the budget leave no room).

use std::time::Instant;

/// What the choice knows about one resident (or loading) model.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    pub name: String,
    /// Measured once loaded, the estimate while loading.
    pub bytes: u64,
    pub last_used: Instant,
    pub pinned: bool,
    /// Reads in flight, or still loading: not a candidate now.
    pub busy: bool,
}

/// The outcome of [`choose`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Unload these (possibly none), in this order, and the new model fits.
    Evict(Vec<String>),
    /// Not now: what busy models hold is needed; a retry after they finish may fit.
    Busy { needed: u64, free_now: u64 },
    /// Never, while the pinned models stay: `needed` is more than `budget` less what they hold.
    Never {
        needed: u64,
        budget: u64,
        pinned: u64,
    },
}

/// What to unload from `residents` so that `needed` more bytes fit in `budget`.
pub fn choose(residents: &[Resident], needed: u64, budget: u64) -> Choice {
    let pinned: u64 = residents.iter().filter(|r| r.pinned).map(|r| r.bytes).sum();
    if needed > budget.saturating_sub(pinned) {
        return Choice::Never {
            needed,
            budget,
            pinned,
        };
    }
    let used: u64 = residents.iter().map(|r| r.bytes).sum();
    let free = budget.saturating_sub(used);
    if needed <= free {
        return Choice::Evict(Vec::new());
    }
    let deficit = needed - free;
    let mut idle: Vec<&Resident> = residents.iter().filter(|r| !r.pinned && !r.busy).collect();
    idle.sort_by_key(|r| r.last_used);
    if let Some(one) = idle.iter().find(|r| r.bytes >= deficit) {
        return Choice::Evict(vec![one.name.clone()]);
    }
    let mut chosen = Vec::new();
    let mut freed = 0u64;
    for r in idle {
        chosen.push(r.name.clone());
        freed += r.bytes;
        if freed >= deficit {
            return Choice::Evict(chosen);
        }
    }
    Choice::Busy {
        needed,
        free_now: free + freed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Residents named by letter, used in the order given (the first is the coldest).
    fn residents(spec: &[(&str, u64, bool, bool)]) -> Vec<Resident> {
        let start = Instant::now();
        spec.iter()
            .enumerate()
            .map(|(i, &(name, bytes, pinned, busy))| Resident {
                name: name.into(),
                bytes,
                last_used: start + Duration::from_secs(i as u64),
                pinned,
                busy,
            })
            .collect()
    }

    fn evict(names: &[&str]) -> Choice {
        Choice::Evict(names.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn nothing_is_evicted_when_it_fits() {
        let r = residents(&[("a", 30, false, false)]);
        assert_eq!(choose(&r, 70, 100), evict(&[]));
    }

    #[test]
    fn the_coldest_model_that_frees_enough_alone_goes_first() {
        // a and b are colder but too small alone; c frees enough by itself.
        let r = residents(&[
            ("a", 10, false, false),
            ("b", 10, false, false),
            ("c", 50, false, false),
            ("d", 20, false, false),
        ]);
        assert_eq!(choose(&r, 40, 100), evict(&["c"]));
        // Of two that would each do, the colder.
        let r = residents(&[("a", 60, false, false), ("b", 60, false, false)]);
        assert_eq!(choose(&r, 50, 130), evict(&["a"]));
    }

    #[test]
    fn else_the_coldest_go_until_enough_is_free() {
        let r = residents(&[
            ("a", 20, false, false),
            ("b", 20, false, false),
            ("c", 20, false, false),
        ]);
        // 40 free: 100 needs all three, 80 the two coldest, 60 the coldest alone.
        assert_eq!(choose(&r, 100, 100), evict(&["a", "b", "c"]));
        assert_eq!(choose(&r, 90, 100), evict(&["a", "b", "c"]));
        assert_eq!(choose(&r, 80, 100), evict(&["a", "b"]));
        assert_eq!(choose(&r, 60, 100), evict(&["a"]));
    }

    #[test]
    fn pinned_and_busy_models_are_never_evicted() {
        let r = residents(&[
            ("pinned", 50, true, false),
            ("busy", 30, false, true),
            ("idle", 10, false, false),
        ]);
        // 10 free; evicting idle gives 20, not 40: wait for busy.
        assert_eq!(
            choose(&r, 40, 100),
            Choice::Busy {
                needed: 40,
                free_now: 20
            }
        );
        assert_eq!(choose(&r, 20, 100), evict(&["idle"]));
    }

    #[test]
    fn what_the_budget_and_the_pinned_models_leave_no_room_for_never_fits() {
        let r = residents(&[("pinned", 50, true, false)]);
        assert_eq!(
            choose(&r, 60, 100),
            Choice::Never {
                needed: 60,
                budget: 100,
                pinned: 50
            }
        );
        assert_eq!(
            choose(&[], 101, 100),
            Choice::Never {
                needed: 101,
                budget: 100,
                pinned: 0
            }
        );
        assert_eq!(choose(&[], 100, 100), evict(&[]));
    }
}
