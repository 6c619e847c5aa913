-- Token bucket: takes up to n tokens, and says how long until the next one is there.
-- KEYS[1] bucket hash: tokens, ts (server ms)
-- ARGV[1] tokens per ms (decimal), ARGV[2] burst (bucket size), ARGV[3] n (>= 1)
-- Returns {taken, wait ms}: taken in 0..n; wait (>= 1) when fewer than n were taken: how long
-- until one more token is there; 0 otherwise.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1] or ARGV[2])
local ts = tonumber(b[2] or now)
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
end
local taken = math.min(n, math.floor(tokens))
if taken < 0 then taken = 0 end
tokens = tokens - taken
local wait = 0
if taken < n then
  wait = math.max(1, math.ceil((1 - tokens) / rate))
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 60000)
return { taken, wait }
