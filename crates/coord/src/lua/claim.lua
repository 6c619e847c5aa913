-- Claims a bot for a live worker, with a fence above every earlier grant.
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] owner     hash  of the bot: w, inc, fence, ho (1 = handed over to w, not yet claimed)
-- KEYS[4] fence     counter of the bot; never decreases, survives release
-- ARGV[1] caller worker id, ARGV[2] caller incarnation, ARGV[3] minimum fence (the store's
-- highest accepted fence, so fences never go back even after Redis lost its data)
-- Returns {'granted', fence} | {'held', w, inc, fence, ho} | {'notlive'}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(w, inc)
  if redis.call('HGET', KEYS[1], w) ~= inc then
    return false
  end
  return tonumber(redis.call('ZSCORE', KEYS[2], w) or '0') > now
end
if not live(ARGV[1], ARGV[2]) then
  return { 'notlive' }
end
local o = redis.call('HMGET', KEYS[3], 'w', 'inc', 'fence', 'ho')
if o[1] then
  local ours = (o[1] == ARGV[1] and o[2] == ARGV[2])
  if not ours and live(o[1], o[2]) then
    return { 'held', o[1], o[2], o[3], o[4] or '0' }
  end
end
local counter = tonumber(redis.call('GET', KEYS[4]) or '0')
local fence = math.max(counter, tonumber(ARGV[3])) + 1
redis.call('SET', KEYS[4], string.format('%d', fence))
redis.call('HSET', KEYS[3], 'w', ARGV[1], 'inc', ARGV[2], 'fence', string.format('%d', fence), 'ho', '0')
return { 'granted', string.format('%d', fence) }
