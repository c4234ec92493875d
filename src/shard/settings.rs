//! The runtime settings every shard reads: one versioned value shared by all shards. A
//! writer (the management API) replaces it and bumps the generation; each shard compares
//! the generation with the one it adopted before each request and each owner message
//! (`Shard::refresh`) and, when it moved, takes the new value. Writes are operator actions
//! (rare); the read path is one atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::runtime::RuntimeSettings;

#[derive(Debug)]
pub struct SettingsCell {
    generation: AtomicU64,
    value: Mutex<(u64, Arc<RuntimeSettings>)>,
}

impl SettingsCell {
    pub fn new(initial: RuntimeSettings) -> Self {
        Self {
            generation: AtomicU64::new(0),
            value: Mutex::new((0, Arc::new(initial))),
        }
    }

    /// The generation of the newest value.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The newest value and its generation.
    pub fn current(&self) -> (u64, Arc<RuntimeSettings>) {
        let v = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        (v.0, v.1.clone())
    }

    /// Replaces the value with `value` (a reload restarts it from the reloaded file).
    pub fn reset(&self, value: RuntimeSettings) {
        let _ = self.update(|_| Ok::<_, std::convert::Infallible>(value));
    }

    /// Replaces the value with what `change` makes of the current one, if it returns
    /// `Ok`; the new generation is visible to every shard when this returns.
    pub fn update<E>(
        &self,
        change: impl FnOnce(&RuntimeSettings) -> Result<RuntimeSettings, E>,
    ) -> Result<Arc<RuntimeSettings>, E> {
        let mut v = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        let next = Arc::new(change(&v.1)?);
        let generation = v.0 + 1;
        *v = (generation, next.clone());
        self.generation.store(generation, Ordering::Release);
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resilience::ResilienceSettings;

    #[test]
    fn an_update_bumps_the_generation_and_a_refused_one_does_not() {
        let cell = SettingsCell::new(RuntimeSettings {
            resilience: ResilienceSettings::default(),
            connections: Default::default(),
            resilience_patch: Default::default(),
        });
        assert_eq!(cell.generation(), 0);
        let r: Result<_, ()> = cell.update(|s| {
            let mut s = s.clone();
            s.resilience.provider_breaker.apikey.failure_threshold = 2;
            Ok(s)
        });
        assert!(r.is_ok());
        assert_eq!(cell.generation(), 1);
        assert_eq!(
            cell.current()
                .1
                .resilience
                .provider_breaker
                .apikey
                .failure_threshold,
            2
        );
        let refused: Result<_, &str> = cell.update(|_| Err("no"));
        assert!(refused.is_err());
        assert_eq!(cell.generation(), 1);
    }
}
