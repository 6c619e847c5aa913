-- Registers a worker with a fresh incarnation and a liveness deadline; prunes dead members.
-- (Prefixed with epoch.lua.)
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] meta      hash  worker -> JSON metadata
-- KEYS[4] beats     hash  worker -> last renewal (server ms)
-- KEYS[5] epoch     hash  (see epoch.lua)
-- KEYS[6] seqs      hash  worker -> write sequence of its registration
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] lease ms, ARGV[4] metadata JSON,
-- ARGV[5] members pub/sub channel, ARGV[6] the epoch id the caller knows ('' if none),
-- ARGV[7] grace ms (the longest lease in the fleet), ARGV[8] id for a new epoch
-- Returns {server ms, epoch id, seq}.
local now = now_ms()
local e = fleet_epoch(KEYS[5], now, ARGV[6], tonumber(ARGV[7]), ARGV[8])
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('HDEL', KEYS[1], w)
  redis.call('HDEL', KEYS[3], w)
  redis.call('HDEL', KEYS[4], w)
  redis.call('HDEL', KEYS[6], w)
  redis.call('ZREM', KEYS[2], w)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], now)
redis.call('HSET', KEYS[6], ARGV[1], 1)
redis.call('PUBLISH', ARGV[5], 'join')
return { string.format('%d', now), e.id or '', '1' }
