-- Takes a fenced lock if free (or renews it when the caller's token already holds it).
-- (Prefixed with epoch.lua.)
-- KEYS[1] lock hash: t (token), f (fence); expires with the TTL
-- KEYS[2] fence counter of the lock; never decreases
-- KEYS[3] epoch hash (see epoch.lua)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] the epoch id the caller knows ('' if none),
-- ARGV[4] grace ms (the longest lease the caller knows in the fleet; 0 if none),
-- ARGV[5] id for a new epoch
-- Returns {fence, epoch id} when held by the caller, {0, epoch id} when another token holds
-- it, {-ms, epoch id} inside a grace window after a data loss: whoever held the lock before
-- the loss may still act on it by its own clock, so nobody gets it for that long.
-- The fence is max(counter + 1, server ms): it keeps growing even if Redis lost the counter.
local now = now_ms()
local e = fleet_epoch(KEYS[3], now, ARGV[3], tonumber(ARGV[4]), ARGV[5])
local eid = e.id or ''
local o = redis.call('HMGET', KEYS[1], 't', 'f')
if o[1] then
  if o[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return { tonumber(o[2]), eid }
  end
  return { 0, eid }
end
local wait = grace_left(e, now)
if wait > 0 then
  return { -wait, eid }
end
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
redis.call('SET', KEYS[2], string.format('%d', fence))
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', string.format('%d', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return { fence, eid }
