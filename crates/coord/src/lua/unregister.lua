-- Ends a worker's liveness in one coordination group at once, if it still holds this
-- incarnation there.
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] seqs; the roster's also KEYS[4] meta and
-- KEYS[5] beats (see register.lua)
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] members pub/sub channel ('' for none)
-- Returns 1 when removed, 0 when it was not this incarnation's.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if #KEYS >= 5 then
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], 'leave')
end
return 1
