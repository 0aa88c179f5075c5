-- wrk script: every request posts one compact `steps` record of 2 steps, what one rank's client sends.
-- Event ids and (rank, step) pairs are unique per request, so each one is a real write, never a duplicate.
-- RUN_ID, T0 and RANKS come from the environment (benchmarks/requests.py sets them).
local run_id = os.getenv("RUN_ID") or "requests-bench"
local t0 = tonumber(os.getenv("T0") or "0")
local ranks = tonumber(os.getenv("RANKS") or "1024")
local thread_count = 0

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
end

local counter = 0

function request()
  counter = counter + 1
  local rank = counter % ranks
  local step = math.floor(counter / ranks) * 2 + 1
  local start = t0 + step * 0.01
  local body = string.format(
    '{"events":[{"event_id":"w%d-%d","run_id":"%s-%d","kind":"steps","time":%.3f,"attempt":0,"rank":%d,' ..
    '"step":[%d,%d],"start":[%.3f,%.3f],"end":[%.3f,%.3f],"comm":[0.002,0.003]}]}',
    tid, counter, run_id, tid, start + 0.02, rank, step, step + 1, start, start + 0.01, start + 0.009, start + 0.019)
  return wrk.format("POST", "/v1/events", {["Content-Type"] = "application/json"}, body)
end
