-- Hands a bot to another worker: the owner record names the target (flagged as handed over),
-- so nobody else can claim it while the target is live, and the target is told to take it.
-- If the target is not live, the bot is simply released.
-- KEYS[1] workers, KEYS[2] deadlines (see claim.lua)
-- KEYS[3] owner hash of the bot
-- KEYS[4] command list of the target worker
-- KEYS[5] seqs hash (see register.lua)
-- ARGV[1] caller worker id, ARGV[2] fence, ARGV[3] target worker id,
-- ARGV[4] the Take command (JSON), ARGV[5] command list TTL ms, ARGV[6] the highest write
-- sequence the caller was answered
-- Returns {1, seq} when handed over, {2, seq} when released (target not live), {0, 0} when
-- not held; seq is the caller's new write sequence (0 when Redis lost earlier writes of the
-- caller: the sequence stays behind, so its next renewal finds the loss).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[3], 'w', 'fence', 'ho')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or o[3] == '1' then
  return { 0, 0 }
end
local target_inc = redis.call('HGET', KEYS[1], ARGV[3])
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[3]) or '0')
local seq = 0
if tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') >= tonumber(ARGV[6]) then
  seq = redis.call('HINCRBY', KEYS[5], ARGV[1], 1)
end
if not target_inc or deadline <= now then
  redis.call('DEL', KEYS[3])
  return { 2, seq }
end
redis.call('HSET', KEYS[3], 'w', ARGV[3], 'inc', target_inc, 'ho', '1')
redis.call('RPUSH', KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[4], ARGV[5])
return { 1, seq }
