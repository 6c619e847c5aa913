-- Token bucket: takes one token or says how long until one is there.
-- KEYS[1] bucket hash: tokens, ts (server ms)
-- ARGV[1] tokens per ms (decimal), ARGV[2] burst (bucket size)
-- Returns 0 when a token was taken, else the wait in ms (>= 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1] or ARGV[2])
local ts = tonumber(b[2] or now)
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.max(1, math.ceil((1 - tokens) / rate))
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 60000)
return wait
