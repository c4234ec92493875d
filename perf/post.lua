-- wrk script: POST an OpenAI chat completion. STREAM=1 in the environment asks for SSE.
local stream = os.getenv("STREAM") == "1"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer perf-key"
wrk.body = '{"model":"' .. (os.getenv("MODEL") or "perf/gpt-4o-mini") .. '","stream":' .. (stream and "true" or "false") ..
  ',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
