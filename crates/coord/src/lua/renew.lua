-- Extends a worker's liveness, only if it still holds this incarnation, has not expired, and
-- Redis still has every write the worker made (none was lost to a restart or a failover).
-- (Prefixed with epoch.lua.)
-- KEYS[1] workers, KEYS[2] deadlines, KEYS[3] epoch, KEYS[4] seqs; the roster's also KEYS[5]
-- meta and KEYS[6] beats (see register.lua): in one coordination group
-- ARGV[1] worker id, ARGV[2] incarnation, ARGV[3] lease ms, ARGV[4] metadata JSON,
-- ARGV[5] the epoch id the caller registered in, ARGV[6] the highest write sequence the
-- caller was answered, ARGV[7] grace ms (the longest lease in the fleet), ARGV[8] id for a new
-- epoch (a Redis that lost everything starts its new epoch, and grace window, as soon as
-- anyone who knows the fleet's lease looks)
-- Returns the new write sequence (>= 1) when renewed, 0 when the liveness is lost (gone,
-- expired, another incarnation, another epoch, or writes of this registration lost). Lost
-- writes mean Redis went back in time (a failover to a lagging replica): other workers'
-- renewals may be lost too, so their liveness looks shorter here than they believe. Until one
-- grace from now, no bot that had an owner is granted (a fleet-wide hold, see claim.lua).
local now = now_ms()
local e = fleet_epoch(KEYS[3], now, ARGV[5], tonumber(ARGV[7]), ARGV[8])
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
-- Before the deadline: a rolled-back deadline may have passed already, and that is the very
-- case that must start the hold.
if tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') < tonumber(ARGV[6]) then
  local till = now + tonumber(ARGV[7])
  if e.id and till > e.hold then
    redis.call('HSET', KEYS[3], 'hold', string.format('%d', till), 'lost', '1')
  end
  return 0
end
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if deadline <= now then
  return 0
end
if ARGV[5] ~= '' and e.id ~= ARGV[5] then
  return 0
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
if #KEYS >= 6 then
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
  redis.call('HSET', KEYS[6], ARGV[1], now)
end
return redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
