-- Releases a lock held by this token.
-- KEYS[1] lock hash (see lock_acquire.lua)
-- ARGV[1] token
-- Returns 1 when released, 0 when the token does not hold it.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
