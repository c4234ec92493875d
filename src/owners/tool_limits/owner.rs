//! Every shard's replica of the learned tool limits.

use crate::config::Config;
use crate::resilience::tool_limit::{Limit, ToolLimits};
use crate::shard::call::CallId;

use super::protocol::{Fact, Reply, Request};
use crate::owners::{Cx, Mechanism};

#[derive(Debug, Default)]
pub struct ToolLimitTable {
    pub limits: ToolLimits,
}

impl Mechanism for ToolLimitTable {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn call(&mut self, _cx: &mut Cx<'_>, _id: CallId, request: Request) {
        match request {}
    }

    fn fact(&mut self, cx: &mut Cx<'_>, fact: Fact) {
        let Fact::Learned {
            provider,
            model,
            tools,
            until_ms,
        } = fact;
        self.limits.learn(
            provider,
            &model,
            Limit { tools, until_ms },
            cx.now.mono_ms(),
        );
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        self.limits.sweep(cx.now.mono_ms());
    }
}
