-- Send buckets: one token from every bucket of a platform call's scopes at once, or none.
-- KEYS[1..n] bucket hashes: tokens, ts (server ms; in the future while the bucket is paused:
--            no token before then, see bucket_pause.lua)
-- ARGV[2k-1], ARGV[2k] tokens per ms (decimal) and burst (bucket size) of KEYS[k]
-- ARGV[2n+1] 1 for a call that yields (it takes only from buckets that keep their reserve,
--            a fifth of the burst, for the others), else 0
-- Returns {wait in ms, k}: {0, 0} when a token was taken from each; else how long until every
-- bucket could give one (nothing taken) and the index (from 0) of the bucket that holds the
-- call longest.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tokens, wait, short = {}, 0, 0
local yields = ARGV[2 * #KEYS + 1] == '1'
for k = 1, #KEYS do
  local rate = tonumber(ARGV[2 * k - 1])
  local burst = tonumber(ARGV[2 * k])
  local b = redis.call('HMGET', KEYS[k], 'tokens', 'ts')
  local have = tonumber(b[1] or ARGV[2 * k])
  local ts = tonumber(b[2] or now)
  local w = 0
  if ts > now then
    -- Paused: a token is there when the pause ends.
    w = ts - now
  else
    have = math.min(burst, have + (now - ts) * rate)
    local need = 1
    if yields then
      need = 1 + math.floor(burst / 5)
    end
    if have < need then
      w = (need - have) / rate
    end
  end
  tokens[k] = have
  if w > wait then
    wait = w
    short = k - 1
  end
end
if wait > 0 then
  return {math.max(1, math.ceil(wait)), short}
end
for k = 1, #KEYS do
  local rate = tonumber(ARGV[2 * k - 1])
  local burst = tonumber(ARGV[2 * k])
  redis.call('HSET', KEYS[k], 'tokens', tostring(tokens[k] - 1), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[k], math.ceil(burst / rate) + 60000)
end
return {0, 0}
