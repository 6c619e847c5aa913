-- The fleet epoch: prepended (when the scripts are loaded) to every script that grants or
-- checks something fenced, so the rule for a Redis that lost its data is written once.
--
-- The epoch hash holds: id; born (server ms); till (server ms: bots the store knows an owner
-- of, granted before `born`, wait until then, one lease after the loss could have happened);
-- lost ('1' once there is evidence that the epoch follows a loss: a caller that knew an older
-- epoch, or a bot whose grant Redis forgot); hold (server ms: until then no bot that had an
-- owner is granted, after a loss within this epoch was found: a failover that lost writes). A Redis that lost everything lacks the hash; the next script that
-- knows the fleet's lease creates it.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Reads the epoch at `key`, creating it when missing if `grace` (ms) is known (> 0).
-- known: the epoch id the caller last saw ('' if none); fresh: the id for a new epoch.
-- Returns {id (false if none), born, till, lost (boolean), hold}.
local function fleet_epoch(key, now, known, grace, fresh)
  local e = redis.call('HMGET', key, 'id', 'born', 'till', 'lost', 'hold')
  if e[1] then
    local lost = e[4] == '1'
    if known ~= '' and known ~= e[1] and not lost then
      redis.call('HSET', key, 'lost', '1')
      lost = true
    end
    return { id = e[1], born = tonumber(e[2]), till = tonumber(e[3]), lost = lost,
             hold = tonumber(e[5] or '0') }
  end
  if grace <= 0 then
    return { id = false, born = 0, till = 0, lost = false, hold = 0 }
  end
  local lost = '0'
  if known ~= '' then lost = '1' end
  redis.call('HSET', key, 'id', fresh, 'born', string.format('%d', now),
    'till', string.format('%d', now + grace), 'lost', lost, 'hold', '0')
  return { id = fresh, born = now, till = now + grace, lost = lost == '1', hold = 0 }
end

-- Milliseconds until fenced grants that cannot be checked (locks, leadership) may be made
-- again: inside the window of an epoch that follows a loss, or of a hold.
local function grace_left(e, now)
  local left = 0
  if e.lost and e.till > now then left = e.till - now end
  if e.hold > now and e.hold - now > left then left = e.hold - now end
  return left
end

-- Script bodies follow.
