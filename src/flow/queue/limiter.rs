//! The per-key limiter (B §1.1): a concurrency cap, a minimum spacing between starts and
//! a refilling per-minute reservoir in front of a FIFO queue of waiters with queue-wait
//! deadlines; plus the owner shard's table of limiters (idle eviction, remembered 429
//! cooldowns, the wedge watchdog).
//!
//! # Protocol
//!
//! * [`Limiter::schedule`] → `StartNow` (the waiter holds a slot now), `StartAt(t)` (it
//!   holds a slot that begins at `t`: spacing), or `Queued`.
//! * A queued waiter is later handed a [`Grant`] by [`Limiter::promote`] (driver calls it
//!   at [`Limiter::next_wake_ns`]) or by [`Limiter::on_finish`] / [`Limiter::cancel`].
//! * Every grant is a dispatch: its start instant is the wedge watchdog's heartbeat (the
//!   asker dispatches at that instant without telling the owner again). A granted waiter
//!   calls [`Limiter::on_finish`] when the call settles.
//! * [`Limiter::expire`] ends queued waiters whose queue-wait deadline passed.
//!
//! A slot is counted from the grant, so a granted-but-not-yet-started waiter (`StartAt`)
//! already occupies concurrency; the spacing applies to grant *start times*, which are
//! non-decreasing in grant order, so starts follow FIFO order.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{LimiterSettings, QueueError, RESERVOIR_REFILL_MS};
use crate::clock::Now;

/// Limiters unused this long (and holding no waiter or slot) are dropped.
pub const LIMITER_IDLE_EVICT_MS: u64 = 10 * 60_000;
/// A limiter with queued work, nothing running, and no dispatch for this long is wedged.
pub const WEDGE_AFTER_MS: u64 = 120_000;
/// Remembered cooldown after an upstream 429 without a retry hint.
pub const KNOWN_COOLDOWN_DEFAULT_MS: u64 = 60_000;
/// Forced spacing after `x-ratelimit-over-limit: yes`.
pub const OVER_LIMIT_MIN_TIME_MS: u64 = 200;
/// Reservoir refilled after an error body's retry hint.
pub const RETRY_HINT_RESERVOIR: u32 = 60;

const NS_PER_MS: u64 = 1_000_000;

/// Identifies one waiting request; chosen by the caller, unique per limiter.
pub type WaiterId = u64;

/// Outcome of [`Limiter::schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// The waiter holds a slot and may dispatch now.
    StartNow,
    /// The waiter holds a slot that begins at this monotonic instant (ns).
    StartAt(u64),
    /// The waiter is in the FIFO queue.
    Queued,
}

/// Outcome of [`LimiterTable::combo_admission`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg(test)]
pub enum ComboAdmission {
    /// Runs now (a slot is held, or the limiter is disabled for the connection).
    Acquired,
    /// Something is queued or running, or spacing / reservoir is not ready: skip the target.
    Busy,
    /// A remembered 429 window has this much left: skip the target.
    Cooldown { remaining_ms: u64 },
}

/// A queued waiter handed a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub waiter: WaiterId,
    /// Monotonic ns at which it may dispatch (≤ the grant's `now` means at once).
    pub start_at_ns: u64,
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    id: WaiterId,
    deadline_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reservoir {
    capacity: u32,
    left: u32,
    interval_ns: u64,
    next_refill_ns: u64,
}

impl Reservoir {
    fn new(capacity: u32, left: u32, interval_ms: u64, now_ns: u64) -> Self {
        let interval_ns = interval_ms.max(1).saturating_mul(NS_PER_MS);
        Self {
            capacity,
            left,
            interval_ns,
            next_refill_ns: now_ns.saturating_add(interval_ns),
        }
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns >= self.next_refill_ns {
            self.left = self.capacity;
            let periods = (now_ns - self.next_refill_ns) / self.interval_ns + 1;
            self.next_refill_ns = self
                .next_refill_ns
                .saturating_add(periods.saturating_mul(self.interval_ns));
        }
    }
}

/// One limiter key's scheduler.
#[derive(Clone, Debug)]
pub struct Limiter {
    settings: LimiterSettings,
    /// Current spacing (configured, or learned).
    min_time_ms: u64,
    reservoir: Option<Reservoir>,
    queue: VecDeque<Waiter>,
    /// Waiters holding a slot (granted, not finished).
    slots: HashSet<WaiterId>,
    /// Start instant of the latest grant.
    last_start_ns: Option<u64>,
    /// Start instant of the latest grant (or creation): the wedge watchdog's heartbeat.
    last_dispatch_ns: u64,
    last_used_ns: u64,
}

impl Limiter {
    pub fn new(settings: LimiterSettings, now: Now) -> Self {
        let reservoir = settings
            .rpm
            .map(|rpm| Reservoir::new(rpm, rpm, RESERVOIR_REFILL_MS, now.mono_ns));
        Self {
            settings,
            min_time_ms: settings.min_time_ms,
            reservoir,
            queue: VecDeque::new(),
            slots: HashSet::new(),
            last_start_ns: None,
            last_dispatch_ns: now.mono_ns,
            last_used_ns: now.mono_ns,
        }
    }

    pub fn settings(&self) -> &LimiterSettings {
        &self.settings
    }

    /// Waiters queued (not holding a slot): the depth [`super::check_queue_admission`] reads.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Waiters holding a slot.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.slots.len()
    }

    /// Current spacing between starts (ms).
    #[cfg(test)]
    pub fn min_time_ms(&self) -> u64 {
        self.min_time_ms
    }

    /// Requests left in the reservoir (`None` = unbounded).
    #[cfg(test)]
    pub fn reservoir_left(&self) -> Option<u32> {
        self.reservoir.map(|r| r.left)
    }

    /// Enqueues `id` and grants it at once when nobody is ahead and a slot is free.
    /// Admission ([`super::check_queue_admission`]) runs before this.
    pub fn schedule(&mut self, id: WaiterId, now: Now) -> Schedule {
        self.enqueue(id, None, now)
    }

    /// [`Limiter::schedule`] for a request with `remaining_budget_ms` of its own left: the
    /// queue deadline is the earlier of the two, and a spent budget fails at once with the
    /// queue-timeout error, without being scheduled (B §1.3).
    #[cfg(test)]
    pub fn schedule_with_budget(
        &mut self,
        id: WaiterId,
        remaining_budget_ms: u64,
        now: Now,
    ) -> Result<Schedule, QueueError> {
        if remaining_budget_ms == 0 {
            return Err(QueueError::QueueTimeout {
                max_wait_ms: self.settings.max_wait_ms,
            });
        }
        let own = now
            .mono_ns
            .saturating_add(remaining_budget_ms.saturating_mul(NS_PER_MS));
        Ok(self.enqueue(id, Some(own), now))
    }

    fn enqueue(&mut self, id: WaiterId, own_deadline_ns: Option<u64>, now: Now) -> Schedule {
        self.last_used_ns = now.mono_ns;
        let queue_deadline = (self.settings.max_wait_ms > 0).then(|| {
            now.mono_ns
                .saturating_add(self.settings.max_wait_ms.saturating_mul(NS_PER_MS))
        });
        let deadline_ns = match (queue_deadline, own_deadline_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let waiter = Waiter { id, deadline_ns };
        if self.queue.is_empty()
            && let Some(start) = self.try_grant(&waiter, now.mono_ns)
        {
            return if start <= now.mono_ns {
                Schedule::StartNow
            } else {
                Schedule::StartAt(start)
            };
        }
        self.queue.push_back(waiter);
        Schedule::Queued
    }

    /// Grants a slot to `w` if one is free and starts within its deadline.
    fn try_grant(&mut self, w: &Waiter, now_ns: u64) -> Option<u64> {
        if self.slots.len() >= self.settings.max_concurrent as usize {
            return None;
        }
        if let Some(r) = self.reservoir.as_mut() {
            r.refill(now_ns);
            if r.left == 0 {
                return None;
            }
        }
        let spaced = self
            .last_start_ns
            .map_or(now_ns, |l| l.saturating_add(self.min_time_ms * NS_PER_MS));
        let start = spaced.max(now_ns);
        if w.deadline_ns.is_some_and(|d| start > d) {
            return None;
        }
        if let Some(r) = self.reservoir.as_mut() {
            r.left -= 1;
        }
        self.slots.insert(w.id);
        self.last_start_ns = Some(start);
        // The heartbeat: this waiter dispatches at `start`.
        self.last_dispatch_ns = self.last_dispatch_ns.max(start);
        Some(start)
    }

    /// Hands slots to queued waiters, head first, while capacity allows.
    pub fn promote(&mut self, now: Now) -> Vec<Grant> {
        let mut grants = Vec::new();
        while let Some(head) = self.queue.front().copied() {
            match self.try_grant(&head, now.mono_ns) {
                Some(start_at_ns) => {
                    self.queue.pop_front();
                    grants.push(Grant {
                        waiter: head.id,
                        start_at_ns,
                    });
                }
                None => break,
            }
        }
        grants
    }

    /// The call of `id` settled (any outcome): frees its slot and promotes.
    pub fn on_finish(&mut self, id: WaiterId, now: Now) -> Vec<Grant> {
        self.last_used_ns = now.mono_ns;
        if self.slots.remove(&id) {
            self.promote(now)
        } else {
            Vec::new()
        }
    }

    /// The client went away: a queued waiter leaves the queue, a granted one frees its
    /// slot. Returns whether `id` was known, and any grants the freed slot allows.
    pub fn cancel(&mut self, id: WaiterId, now: Now) -> (bool, Vec<Grant>) {
        if let Some(pos) = self.queue.iter().position(|w| w.id == id) {
            self.queue.remove(pos);
            // A head that could not start in time may have been holding others back.
            return (true, self.promote(now));
        }
        if self.slots.contains(&id) {
            return (true, self.on_finish(id, now));
        }
        (false, Vec::new())
    }

    /// Ends queued waiters whose queue-wait deadline passed (503, the upstream is never
    /// called). Call [`Limiter::promote`] afterwards: a removed head may unblock others.
    pub fn expire(&mut self, now: Now) -> Vec<(WaiterId, QueueError)> {
        let err = QueueError::QueueTimeout {
            max_wait_ms: self.settings.max_wait_ms,
        };
        let mut out = Vec::new();
        self.queue.retain(|w| {
            let dead = w.deadline_ns.is_some_and(|d| d <= now.mono_ns);
            if dead {
                out.push((w.id, err));
            }
            !dead
        });
        out
    }

    /// When the driver should next call `expire` + `promote` (`None`: nothing pending).
    pub fn next_wake_ns(&self) -> Option<u64> {
        if self.queue.is_empty() {
            return None;
        }
        let deadline = self.queue.iter().filter_map(|w| w.deadline_ns).min();
        let refill = self
            .reservoir
            .filter(|r| r.left == 0)
            .map(|r| r.next_refill_ns);
        // Spacing needs no timer: a grant that must wait for it is a `StartAt`. A head is
        // held back only by concurrency (freed by `on_finish`), an empty reservoir (its
        // refill) or a start past its deadline (its expiry).
        [deadline, refill].into_iter().flatten().min()
    }

    /// The wedge watchdog's pure check (B §1.2): queued work, no slot held, no dispatch
    /// for [`WEDGE_AFTER_MS`] — and, unlike OmniRoute, nothing legitimate holding the head
    /// back: a head waiting for a reservoir refill or for the spacing after the last start
    /// (both still in the future) is not wedged; it is granted then, or its queue budget
    /// ends it first.
    pub fn is_wedged(&self, now: Now) -> bool {
        let waiting_for_refill = self
            .reservoir
            .is_some_and(|r| r.left == 0 && r.next_refill_ns > now.mono_ns);
        let waiting_for_spacing = self.last_start_ns.is_some_and(|l| {
            l.saturating_add(self.min_time_ms.saturating_mul(NS_PER_MS)) > now.mono_ns
        });
        !self.queue.is_empty()
            && self.slots.is_empty()
            && !waiting_for_refill
            && !waiting_for_spacing
            && now.mono_ns.saturating_sub(self.last_dispatch_ns) >= WEDGE_AFTER_MS * NS_PER_MS
    }

    /// Non-blocking admission (B §1.2c): takes a slot for `id` only when the limiter is
    /// idle (nothing queued) and a start is possible *now* (concurrency, spacing and
    /// reservoir all ready); never queues.
    #[cfg(test)]
    pub fn try_acquire_now(&mut self, id: WaiterId, now: Now) -> bool {
        self.last_used_ns = now.mono_ns;
        if !self.queue.is_empty() || !self.slots.is_empty() {
            return false;
        }
        let ready = self
            .last_start_ns
            .is_none_or(|l| l.saturating_add(self.min_time_ms * NS_PER_MS) <= now.mono_ns);
        ready
            && self
                .try_grant(
                    &Waiter {
                        id,
                        deadline_ns: Some(now.mono_ns),
                    },
                    now.mono_ns,
                )
                .is_some()
    }

    /// Rejects every queued waiter with [`QueueError::Wedged`].
    pub fn drain_wedged(&mut self) -> Vec<(WaiterId, QueueError)> {
        self.queue
            .drain(..)
            .map(|w| (w.id, QueueError::Wedged))
            .collect()
    }

    fn is_idle(&self, now_ns: u64) -> bool {
        self.is_unused()
            && now_ns.saturating_sub(self.last_used_ns) >= LIMITER_IDLE_EVICT_MS * NS_PER_MS
    }

    /// Nobody queued and no slot held.
    fn is_unused(&self) -> bool {
        self.queue.is_empty() && self.slots.is_empty()
    }

    // ---- learning (B §1.2); the parsing lives in `learn.rs` ----

    /// Sets the spacing (learned); never below the configured spacing.
    pub fn set_min_time_ms(&mut self, ms: u64) {
        self.min_time_ms = ms.max(self.settings.min_time_ms);
    }

    /// Forces the spacing, even below the configured one (`x-ratelimit-over-limit` and the
    /// request-limit header give the upstream's own number).
    pub fn force_min_time_ms(&mut self, ms: u64) {
        self.min_time_ms = ms;
    }

    /// Replaces the reservoir: `left` now, refilled to `capacity` every `interval_ms`.
    pub fn set_reservoir(&mut self, capacity: u32, left: u32, interval_ms: u64, now: Now) {
        self.reservoir = Some(Reservoir::new(capacity, left, interval_ms, now.mono_ns));
    }

    /// New settings (PATCH, reload): spacing and reservoir go back to the new configured
    /// ones; waiters keep their place, their deadlines and their slots.
    pub fn reconfigure(&mut self, settings: LimiterSettings, now: Now) {
        self.settings = settings;
        self.relax(now);
    }

    /// Back to the configured spacing and reservoir.
    pub fn relax(&mut self, now: Now) {
        self.min_time_ms = self.settings.min_time_ms;
        let configured = self
            .settings
            .rpm
            .map(|rpm| Reservoir::new(rpm, rpm, RESERVOIR_REFILL_MS, now.mono_ns));
        if self.reservoir.map(|r| (r.capacity, r.interval_ns))
            != configured.map(|r| (r.capacity, r.interval_ns))
        {
            self.reservoir = configured;
        }
    }
}

/// The owner shard's limiters, by limiter key.
#[derive(Debug, Default)]
pub struct LimiterTable {
    limiters: HashMap<String, Limiter>,
    /// Limiter key → monotonic ns until which an upstream 429 asked us to hold off.
    known_cooldowns: HashMap<String, u64>,
}

impl LimiterTable {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// The limiter of `key`, created with `settings` on first use; an existing limiter
    /// whose settings changed (PATCH, reload) is reconfigured in place.
    pub fn get_or_create(
        &mut self,
        key: &str,
        settings: LimiterSettings,
        now: Now,
    ) -> &mut Limiter {
        let l = self
            .limiters
            .entry(key.to_owned())
            .or_insert_with(|| Limiter::new(settings, now));
        if l.settings != settings {
            l.reconfigure(settings, now);
        }
        l
    }

    pub fn get(&self, key: &str) -> Option<&Limiter> {
        self.limiters.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Limiter> {
        self.limiters.get_mut(key)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.limiters.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.limiters.is_empty()
    }

    /// An upstream 429 on `key`: learned limits are discarded and a cooldown of
    /// `retry_after_ms` (default [`KNOWN_COOLDOWN_DEFAULT_MS`]) is remembered. Waiters
    /// already in the limiter stay where they are.
    pub fn on_upstream_429(&mut self, key: &str, retry_after_ms: Option<u64>, now: Now) {
        let ms = retry_after_ms.unwrap_or(KNOWN_COOLDOWN_DEFAULT_MS);
        let until = now.mono_ns.saturating_add(ms.saturating_mul(NS_PER_MS));
        let slot = self.known_cooldowns.entry(key.to_owned()).or_insert(until);
        *slot = (*slot).max(until);
        if let Some(l) = self.limiters.get_mut(key) {
            l.relax(now);
        }
    }

    /// A 2xx on `key` clears its remembered cooldown.
    pub fn on_upstream_success(&mut self, key: &str) {
        self.known_cooldowns.remove(key);
    }

    /// Time left (ms) of the remembered 429 cooldown of `key`.
    pub fn known_cooldown_ms(&self, key: &str, now: Now) -> Option<u64> {
        let until = *self.known_cooldowns.get(key)?;
        (until > now.mono_ns).then(|| (until - now.mono_ns).div_ceil(NS_PER_MS))
    }

    /// Non-blocking admission of a combo target (B §1.2c, optional in the spec): a
    /// remembered 429 cooldown first, then the limiter's readiness. `Acquired` holds a
    /// slot: the caller reports `on_finish` as for any grant.
    #[cfg(test)]
    pub fn combo_admission(
        &mut self,
        key: &str,
        settings: LimiterSettings,
        id: WaiterId,
        now: Now,
    ) -> ComboAdmission {
        if !settings.enabled {
            return ComboAdmission::Acquired;
        }
        if let Some(remaining_ms) = self.known_cooldown_ms(key, now) {
            return ComboAdmission::Cooldown { remaining_ms };
        }
        if self
            .get_or_create(key, settings, now)
            .try_acquire_now(id, now)
        {
            ComboAdmission::Acquired
        } else {
            ComboAdmission::Busy
        }
    }

    /// The wedge watchdog's sweep: rejects the waiters of every wedged limiter and
    /// replaces it with a fresh one (same settings).
    pub fn sweep_wedged(&mut self, now: Now) -> Vec<(String, WaiterId, QueueError)> {
        let mut out = Vec::new();
        for (key, l) in self.limiters.iter_mut() {
            if l.is_wedged(now) {
                for (w, e) in l.drain_wedged() {
                    out.push((key.clone(), w, e));
                }
                *l = Limiter::new(l.settings, now);
            }
        }
        out
    }

    /// How many limiters the table holds (`tidegate_owner_entries{table="request_queues"}`).
    pub fn entry_count(&self) -> usize {
        self.limiters.len()
    }

    /// Drops the limiters whose key `keep` refuses (their connection was removed, or its
    /// queue turned off) as soon as nobody is queued on them or holds a slot, and the
    /// remembered 429 cooldowns of those keys; returns how many limiters were dropped.
    /// A limiter still in use stays until a later call finds it unused.
    pub fn forget(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.limiters.len();
        self.limiters.retain(|k, l| keep(k) || !l.is_unused());
        self.known_cooldowns
            .retain(|k, _| keep(k) || self.limiters.contains_key(k));
        before - self.limiters.len()
    }

    /// Drops limiters idle for [`LIMITER_IDLE_EVICT_MS`] and expired cooldowns; returns
    /// how many limiters were dropped.
    pub fn evict_idle(&mut self, now: Now) -> usize {
        let before = self.limiters.len();
        self.limiters.retain(|_, l| !l.is_idle(now.mono_ns));
        self.known_cooldowns.retain(|_, until| *until > now.mono_ns);
        before - self.limiters.len()
    }
}
