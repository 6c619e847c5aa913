-- Reads a bot's owner record and whether its holder is live.
-- KEYS[1] workers, KEYS[2] deadlines (see claim.lua), KEYS[3] owner hash of the bot
-- ARGV[1] grace ms (the longest lease in the fleet)
-- Returns {} when unowned, else {w, inc, fence, ho, live (1/0)}. A hand-over that lapsed
-- (see claim.lua) is nobody's: not live.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[3], 'w', 'inc', 'fence', 'ho', 'at')
if not o[1] then
  return {}
end
local live = 0
if redis.call('HGET', KEYS[1], o[1]) == o[2]
  and tonumber(redis.call('ZSCORE', KEYS[2], o[1]) or '0') > now
  and not (o[4] == '1' and now >= tonumber(o[5] or '0') + tonumber(ARGV[1])) then
  live = 1
end
return { o[1], o[2], o[3], o[4] or '0', tostring(live) }
