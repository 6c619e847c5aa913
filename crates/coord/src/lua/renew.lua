-- Extends a worker's liveness, only if it still holds this incarnation and has not expired.
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] meta, KEYS[4] beats (see register.lua)
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] lease ms, ARGV[4] metadata JSON
-- Returns 1 when renewed, 0 when the liveness is lost (gone, expired or another incarnation).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if deadline <= now then
  return 0
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], now)
return 1
