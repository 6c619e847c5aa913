-- Takes a fenced lock if free (or renews it when the caller's token already holds it).
-- KEYS[1] lock hash: t (token), f (fence); expires with the TTL
-- KEYS[2] fence counter of the lock; never decreases
-- ARGV[1] token, ARGV[2] ttl ms
-- Returns the fence when held by the caller, 0 when another token holds it.
-- The fence is max(counter + 1, server ms): it keeps growing even if Redis lost the counter.
local o = redis.call('HMGET', KEYS[1], 't', 'f')
if o[1] then
  if o[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(o[2])
  end
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
redis.call('SET', KEYS[2], string.format('%d', fence))
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', string.format('%d', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
