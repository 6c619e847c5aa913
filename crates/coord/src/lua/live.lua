-- Lists the live workers.
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] meta, KEYS[4] beats (see register.lua)
-- Returns {now, worker1, incarnation1, meta1, beat1, deadline1, worker2, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = { string.format('%d', now) }
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
