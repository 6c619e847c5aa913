-- Registers a worker with a fresh incarnation and a liveness deadline in one coordination
-- group; prunes its dead members. (Prefixed with epoch.lua.) Every group keeps its own view of
-- the fleet's liveness (workers, deadlines, epoch, write sequences); the roster (group 0) also
-- keeps the workers' metadata and renewals, and announces the join.
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] epoch     hash  (see epoch.lua)
-- KEYS[4] seqs      hash  worker -> write sequence of its registration
-- KEYS[5] meta      hash  worker -> JSON metadata           (the roster only)
-- KEYS[6] beats     hash  worker -> last renewal (server ms) (the roster only)
-- KEYS[7] layout    hash  groups -> the fleet's number of coordination groups (the roster only)
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] lease ms, ARGV[4] metadata JSON,
-- ARGV[5] members pub/sub channel ('' for none), ARGV[6] the epoch id the caller knows ('' if
-- none), ARGV[7] grace ms (the longest lease in the fleet), ARGV[8] id for a new epoch,
-- ARGV[9] the caller's number of groups (the roster only)
-- Returns {server ms, epoch id, seq}, or {'groups', the fleet's number} (registering nothing)
-- when other workers are live and split the keys into another number of groups than the
-- caller (a fleet without a record has one group: it began before groups).
local now = now_ms()
local roster = #KEYS >= 7
local e = fleet_epoch(KEYS[3], now, ARGV[6], tonumber(ARGV[7]), ARGV[8])
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('HDEL', KEYS[1], w)
  redis.call('HDEL', KEYS[4], w)
  if roster then
    redis.call('HDEL', KEYS[5], w)
    redis.call('HDEL', KEYS[6], w)
  end
  redis.call('ZREM', KEYS[2], w)
end
if roster then
  local others = redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], ARGV[1])
  local fleet = redis.call('HGET', KEYS[7], 'groups') or '1'
  if others > 0 and fleet ~= ARGV[9] then
    return { 'groups', fleet }
  end
  redis.call('HSET', KEYS[7], 'groups', ARGV[9])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], 1)
if roster then
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
  redis.call('HSET', KEYS[6], ARGV[1], now)
end
if ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], 'join')
end
return { string.format('%d', now), e.id or '', '1' }
