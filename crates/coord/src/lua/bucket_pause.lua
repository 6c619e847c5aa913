-- Pauses a send bucket (a 429's retry-after): no token from it before then, one at its end.
-- A longer pause already set stays.
-- KEYS[1] bucket hash (see buckets.lua)
-- ARGV[1] pause ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local till = now + tonumber(ARGV[1])
local ts = tonumber(redis.call('HGET', KEYS[1], 'ts') or '0')
if till > ts then
  redis.call('HSET', KEYS[1], 'tokens', '1', 'ts', tostring(till))
end
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(till, ts) - now) + 60000)
return 1
