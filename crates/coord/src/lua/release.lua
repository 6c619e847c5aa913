-- Releases a bot if the caller holds it under this fence.
-- KEYS[1] owner hash of the bot (see claim.lua)
-- ARGV[1] caller worker id, ARGV[2] fence
-- Returns 1 when released, 0 otherwise.
local o = redis.call('HMGET', KEYS[1], 'w', 'fence')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
