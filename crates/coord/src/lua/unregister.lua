-- Ends a worker's liveness at once, if it still holds this incarnation.
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] meta, KEYS[4] beats, KEYS[5] seqs
-- (see register.lua)
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] members pub/sub channel
-- Returns 1 when removed, 0 when it was not this incarnation's.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], 'leave')
return 1
