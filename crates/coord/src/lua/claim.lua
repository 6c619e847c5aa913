-- Claims a bot for a live worker, with a fence above every earlier grant.
-- (Prefixed with epoch.lua.)
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] owner     hash  of the bot: w, inc, fence, ho (1 = handed over to w, not yet
--                   claimed), at (when it was handed over, server ms)
-- KEYS[4] fence     counter of the bot; never decreases, survives release
-- KEYS[5] epoch     hash (see epoch.lua)
-- KEYS[6] seqs      hash  worker -> write sequence of its registration
-- ARGV[1] caller worker id, ARGV[2] caller incarnation, ARGV[3] minimum fence (the store's
-- highest accepted fence), ARGV[4] the epoch id the caller knows ('' if none), ARGV[5] grace
-- ms (the longest lease in the fleet), ARGV[6] id for a new epoch, ARGV[7] the highest write
-- sequence the caller was answered
-- Returns {'granted', fence, seq} | {'held', w, inc, fence, ho} | {'grace', ms} | {'notlive'}.
--
-- A bot that had an owner (minimum above 0) is granted only once that owner must have
-- stopped after a data loss: the store's minimum above the counter means Redis forgot a grant
-- the store saw. A grant older than the epoch waits for the epoch's window; one lost within
-- it (a failover to a replica that missed writes) starts a fleet-wide hold of one grace from
-- now, as does a caller (here or in renew.lua) whose own writes were lost: owners' liveness
-- may have been rolled back too, and such a caller may claim nothing until it registers again. The fence is also at least the server time in ms, so a grant made after a
-- loss is above one made before it that the store has not seen yet.
local now = now_ms()
local function live(w, inc)
  if redis.call('HGET', KEYS[1], w) ~= inc then
    return false
  end
  return tonumber(redis.call('ZSCORE', KEYS[2], w) or '0') > now
end
if not live(ARGV[1], ARGV[2]) then
  return { 'notlive' }
end
local grace = tonumber(ARGV[5])
local e = fleet_epoch(KEYS[5], now, ARGV[4], grace, ARGV[6])
if tonumber(redis.call('HGET', KEYS[6], ARGV[1]) or '0') < tonumber(ARGV[7]) then
  if e.id and now + grace > e.hold then
    redis.call('HSET', KEYS[5], 'hold', string.format('%d', now + grace), 'lost', '1')
  end
  return { 'notlive' }
end
local o = redis.call('HMGET', KEYS[3], 'w', 'inc', 'fence', 'ho', 'at')
if o[1] then
  local ours = (o[1] == ARGV[1] and o[2] == ARGV[2])
  -- A hand-over its target has not taken within a grace (the longest lease) lapses: the
  -- target may have let the Take go (the bot was no longer its own by its view, and its
  -- claim could not be granted then), and the bot goes to whoever claims it. The old owner
  -- stopped it before handing it over.
  local lapsed = o[4] == '1' and now >= tonumber(o[5] or '0') + grace
  if not ours and not lapsed and live(o[1], o[2]) then
    return { 'held', o[1], o[2], o[3], o[4] or '0' }
  end
end
local counter = tonumber(redis.call('GET', KEYS[4]) or '0')
local min = tonumber(ARGV[3])
local till = 0
if min > counter then
  if e.id and min < e.born then
    till = e.till
    if not e.lost then
      redis.call('HSET', KEYS[5], 'lost', '1')
    end
  else
    till = now + grace
    redis.call('SET', KEYS[4], string.format('%d', min))
    counter = min
    if e.id and till > e.hold then
      redis.call('HSET', KEYS[5], 'hold', string.format('%d', till), 'lost', '1')
    end
  end
end
if min > 0 and e.hold > till then
  till = e.hold
end
if till > now then
  return { 'grace', string.format('%d', till - now) }
end
local fence = math.max(counter + 1, min + 1, now)
redis.call('SET', KEYS[4], string.format('%d', fence))
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'w', ARGV[1], 'inc', ARGV[2], 'fence', string.format('%d', fence), 'ho', '0')
local seq = redis.call('HINCRBY', KEYS[6], ARGV[1], 1)
return { 'granted', string.format('%d', fence), string.format('%d', seq) }
