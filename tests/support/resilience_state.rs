//! Reading the resilience state a gateway shows on its management API (open on loopback):
//! a connection's recorded failure and the breakers' failure counts.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use super::client::Client;
use super::eventually::eventually;

/// The connection `id` as `/api/resilience/cooldowns` shows it, once its last error type
/// is `want` (waits up to 5 s).
pub fn connection_once(addr: SocketAddr, id: &str, want: &str) -> Value {
    eventually(Duration::from_secs(5), "the failure recorded", || {
        let r = Client::connect(addr).request("GET", "/api/resilience/cooldowns", &[], b"");
        let list = r.json()["connections"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.into_iter()
            .find(|c| c["id"] == id && c["lastErrorType"] == want)
    })
}

/// The failures the breakers have counted, summed over every breaker.
pub fn breaker_failures(addr: SocketAddr) -> u64 {
    let r = Client::connect(addr).request("GET", "/api/monitoring/health", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["providerBreakers"].as_array().map_or(0, |list| {
        list.iter()
            .map(|b| b["failureCount"].as_u64().unwrap_or(0))
            .sum()
    })
}
