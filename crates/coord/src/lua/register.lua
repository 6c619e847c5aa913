-- Registers a worker with a fresh incarnation and a liveness deadline; prunes dead members.
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] meta      hash  worker -> JSON metadata
-- KEYS[4] beats     hash  worker -> last renewal (server ms)
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] lease ms, ARGV[4] metadata JSON,
-- ARGV[5] members pub/sub channel
-- Returns the server time in ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('HDEL', KEYS[1], w)
  redis.call('HDEL', KEYS[3], w)
  redis.call('HDEL', KEYS[4], w)
  redis.call('ZREM', KEYS[2], w)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], now)
redis.call('PUBLISH', ARGV[5], 'join')
return now
