-- Hands a bot to another worker: the owner record names the target (flagged as handed over),
-- so nobody else can claim it while the target is live, and the target is told to take it.
-- If the target is not live, the bot is simply released.
-- KEYS[1] workers, KEYS[2] deadlines (see claim.lua)
-- KEYS[3] owner hash of the bot
-- KEYS[4] command list of the target worker
-- ARGV[1] caller worker id, ARGV[2] fence, ARGV[3] target worker id,
-- ARGV[4] the Take command (JSON), ARGV[5] command list TTL ms
-- Returns 1 when handed over, 2 when released (target not live), 0 when not held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[3], 'w', 'fence', 'ho')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or o[3] == '1' then
  return 0
end
local target_inc = redis.call('HGET', KEYS[1], ARGV[3])
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[3]) or '0')
if not target_inc or deadline <= now then
  redis.call('DEL', KEYS[3])
  return 2
end
redis.call('HSET', KEYS[3], 'w', ARGV[3], 'inc', target_inc, 'ho', '1')
redis.call('RPUSH', KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[4], ARGV[5])
return 1
