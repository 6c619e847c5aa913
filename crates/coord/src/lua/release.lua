-- Releases a bot if the caller holds it under this fence.
-- KEYS[1] owner hash of the bot (see claim.lua)
-- KEYS[2] seqs hash (see register.lua)
-- ARGV[1] caller worker id, ARGV[2] fence, ARGV[3] the highest write sequence the caller was
-- answered
-- Returns -1 when not held, else the caller's new write sequence (0 when Redis lost earlier
-- writes of the caller: the sequence stays behind, so its next renewal finds the loss).
local o = redis.call('HMGET', KEYS[1], 'w', 'fence')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] then
  return -1
end
redis.call('DEL', KEYS[1])
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') < tonumber(ARGV[3]) then
  return 0
end
return redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
