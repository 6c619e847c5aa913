-- Lists the live workers. (Prefixed with epoch.lua.)
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] meta, KEYS[4] beats, KEYS[5] epoch
-- (see register.lua)
-- ARGV[1] the epoch id the caller knows ('' if none), ARGV[2] grace ms (0 if the caller knows
-- no lease), ARGV[3] id for a new epoch: workers list members every few seconds, so a Redis
-- that lost everything starts its new epoch (and grace window) within moments.
-- Returns {now, epoch id, worker1, incarnation1, meta1, beat1, deadline1, worker2, ...}.
local now = now_ms()
local e = fleet_epoch(KEYS[5], now, ARGV[1], tonumber(ARGV[2]), ARGV[3])
local out = { string.format('%d', now), e.id or '' }
local alive = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
for _, w in ipairs(alive) do
  local inc = redis.call('HGET', KEYS[1], w)
  if inc then
    table.insert(out, w)
    table.insert(out, inc)
    table.insert(out, redis.call('HGET', KEYS[3], w) or '{}')
    table.insert(out, redis.call('HGET', KEYS[4], w) or string.format('%d', now))
    table.insert(out, redis.call('ZSCORE', KEYS[2], w))
  end
end
return out
