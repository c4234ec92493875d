-- wrk script for perf/snapshot_block.sh: alternates a failing and a succeeding model of the
-- in-process mock provider, so every request changes some connection's or breaker's state.
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  n = n + 1
  local model = (n % 2 == 0) and "churn/fail-503" or "churn/echo"
  return wrk.format(nil, "/v1/chat/completions", nil,
    '{"model":"' .. model .. '","messages":[{"role":"user","content":"hi"}]}')
end
