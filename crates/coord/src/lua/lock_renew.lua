-- Extends a lock held by this token.
-- KEYS[1] lock hash (see lock_acquire.lua)
-- ARGV[1] token, ARGV[2] ttl ms
-- Returns 1 when extended, 0 when the token does not hold it.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
