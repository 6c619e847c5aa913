-- Reads the fleet epoch without changing it. (Prefixed with epoch.lua.)
-- KEYS[1] epoch hash
-- Returns {} when there is none, else {id, age ms, grace left ms, lost (1/0)}.
local now = now_ms()
local e = fleet_epoch(KEYS[1], now, '', 0, '')
if not e.id then
  return {}
end
return { e.id, string.format('%d', now - e.born), string.format('%d', grace_left(e, now)),
  e.lost and '1' or '0' }
