//! Teaching every shard a tool limit, and reading this shard's replica.

use crate::config::ProviderId;
use crate::owners::Shard;

use super::protocol::Fact;

/// Tells every shard that `provider/model` refuses requests with `tools` or more tools
/// for `for_ms` from now.
pub fn learn(shard: &Shard, provider: ProviderId, model: &str, tools: u32, for_ms: u64) {
    let until_ms = shard.now().mono_ms().saturating_add(for_ms);
    for to in 0..shard.shards() {
        let fact = Fact::Learned {
            provider,
            model: model.to_owned(),
            tools,
            until_ms,
        };
        shard.send_fact(to, fact.into());
    }
}

/// Does a learned limit steer a request with `tools` tools away from `provider/model`
/// (this shard's replica)?
pub fn steers_away(shard: &Shard, provider: ProviderId, model: &str, tools: usize) -> bool {
    let now_ms = shard.now().mono_ms();
    shard
        .state()
        .owners
        .tool_limits
        .borrow()
        .limits
        .steers_away(provider, model, tools, now_ms)
}
