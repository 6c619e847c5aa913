-- Hands a bot to another worker: the owner record names the target (flagged as handed over,
-- with the time), so nobody else can claim it while the target is live (for a grace at most:
-- see claim.lua), and the target is told to take it —
-- here when its command list is given (it shares the bot's hash tag: one group), else by the
-- caller right after.
-- If the target is not live, the bot is simply released.
-- KEYS[1] workers, KEYS[2] deadlines (see claim.lua)
-- KEYS[3] owner hash of the bot
-- KEYS[4] seqs hash (see register.lua)
-- KEYS[5] command list of the target worker (optional)
-- ARGV[1] caller worker id, ARGV[2] fence, ARGV[3] target worker id, ARGV[4] the highest
-- write sequence the caller was answered, ARGV[5] the Take command (JSON) and ARGV[6] the
-- command list TTL ms (with KEYS[5])
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
if tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') >= tonumber(ARGV[4]) then
  seq = redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
end
if not target_inc or deadline <= now then
  redis.call('DEL', KEYS[3])
  return { 2, seq }
end
redis.call('HSET', KEYS[3], 'w', ARGV[3], 'inc', target_inc, 'ho', '1', 'at', string.format('%d', now))
if KEYS[5] then
  redis.call('RPUSH', KEYS[5], ARGV[5])
  redis.call('PEXPIRE', KEYS[5], ARGV[6])
end
return { 1, seq }
