-- A chat's turn queue: tickets served in the order they were taken, one holder at a time,
-- a holder's turn valid while its worker's liveness holds. (Prefixed with epoch.lua.)
-- KEYS[1] workers   hash  worker -> incarnation
-- KEYS[2] deadlines zset  worker -> liveness deadline (server ms)
-- KEYS[3] turn      hash  of the chat: next, serving, hw/hi/hk (holder: worker, incarnation,
--                   and the ticket it asked with), f (last fence),
--                   t<n> = "worker|incarnation|entry" per ticket not yet served
-- KEYS[4] epoch     hash  (see epoch.lua)
-- KEYS[5] seqs      hash  worker -> write sequence of its registration (see register.lua)
-- ARGV[1] op: 'take' | 'try' | 'release'
-- ARGV[2] caller worker id, ARGV[3] caller incarnation
-- ARGV[4] take: the journal entry key; try/release: the ticket
-- ARGV[5] release: the turn's fence
-- ARGV[6] the wake channel prefix (the next ticket's worker id is appended)
-- ARGV[7] the chat key (the wake-up's message)
-- ARGV[8] ms after which a ticket whose turn came and that nobody holds counts as abandoned
--         even if its taker is live (a taker that lost track of it)
-- ARGV[9] the epoch id the caller knows ('' if none), ARGV[10] grace ms (the longest lease
--         the caller knows), ARGV[11] id for a new epoch
-- ARGV[12] ms after a loss's grace window during which grants say 'after loss'
-- ARGV[13] the highest write sequence the caller was answered
-- Returns take: {ticket, answer...}; try: {answer...}; release: {'1', seq} | {'0'} where
-- answer is 'granted', ticket, fence, after_loss, seq | 'wait' | 'takeover', ticket, entry,
-- fence, after_loss, seq | 'passed' | 'notlive', and seq the caller's new write sequence.
--
-- A grant and a release are writes of the caller's registration like a claim: each moves its
-- write sequence on (unless Redis lost earlier writes of the caller: then the sequence stays
-- behind, so its next renewal finds the loss). A failover that lost a grant or a release is
-- found so, and the fleet holds grants for a grace window (see renew.lua): the worker whose
-- grant Redis forgot may still be acting on it.
--
-- Fences are max(last + 1, server time in µs): a chat forgotten when its queue empties (or
-- by a data loss) still gets fences above the ones granted before. Ticket numbers start at
-- the server time in µs when a queue is made, so a number is never reused for a chat.
-- Taking is idempotent per entry (`e<entry>` names its ticket while it waits): a take whose
-- answer was lost is asked again and answers the same ticket.
-- A holder is granted again only when it asks with the ticket it was granted for (`hk`): a
-- worker may have two askers of one chat (the task that took over a ticket, and the task
-- that took it, from before the worker registered again) and only one of them holds it.
--
-- After a data loss no turn is granted inside the epoch's grace window: a holder granted
-- before the loss (its queue forgotten) may still be acting by its own clock. For a while
-- after the window, grants say 'after loss' ('1'): entries of the chat whose tickets were
-- lost may still be pending, and the holder serves them first.
local t = redis.call('TIME')
local ms_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local us_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function live(w, inc)
  if redis.call('HGET', KEYS[1], w) ~= inc then
    return false
  end
  return tonumber(redis.call('ZSCORE', KEYS[2], w) or '0') > ms_now
end
local me, inc = ARGV[2], ARGV[3]
-- Moves the caller's write sequence on, unless Redis lost earlier writes of it ('0').
local function bump()
  if tonumber(redis.call('HGET', KEYS[5], me) or '0') < tonumber(ARGV[13]) then
    return '0'
  end
  return string.format('%d', redis.call('HINCRBY', KEYS[5], me, 1))
end
local function taker(field)
  local v = redis.call('HGET', KEYS[3], field)
  if not v then
    return nil
  end
  local a = string.find(v, '|', 1, true)
  local b = string.find(v, '|', a + 1, true)
  return string.sub(v, 1, a - 1), string.sub(v, a + 1, b - 1), string.sub(v, b + 1)
end
-- The epoch's word on granting now: nil inside a grace window, else '1' while a loss is
-- recent, '0' otherwise.
local function after_loss()
  local e = fleet_epoch(KEYS[4], ms_now, ARGV[9], tonumber(ARGV[10]), ARGV[11])
  if grace_left(e, ms_now) > 0 then
    return nil
  end
  if e.lost and ms_now < math.max(e.till, e.hold) + tonumber(ARGV[12]) then
    return '1'
  end
  return '0'
end
-- Grants the serving ticket to the caller, who asked with ticket `asker`.
local function grant(kind, ticket, entry, asker)
  local recent = after_loss()
  if not recent then
    return { 'wait' }
  end
  local f = math.max(tonumber(redis.call('HGET', KEYS[3], 'f') or '0') + 1, us_now)
  local fs = string.format('%d', f)
  redis.call('HSET', KEYS[3], 'hw', me, 'hi', inc, 'hk', asker, 'f', fs)
  if kind == 'granted' then
    return { 'granted', ticket, fs, recent, bump() }
  end
  return { 'takeover', ticket, entry or '', fs, recent, bump() }
end
local function try(ticket)
  local h = redis.call('HMGET', KEYS[3], 'next', 'serving', 'hw', 'hi', 'hk')
  if not h[1] then
    return { 'passed' }
  end
  local serving = tonumber(h[2] or '0')
  local n = tonumber(ticket)
  if n < serving then
    return { 'passed' }
  end
  local s = string.format('%d', serving)
  local asker = string.format('%d', n)
  if h[3] then
    -- (A holder recorded without `hk`, by an older version, is its serving ticket's asker.)
    if h[3] == me and h[4] == inc and (h[5] == asker or (not h[5] and serving == n)) then
      -- The holder asking again (its lease was unsafe for a while): still its own.
      if serving == n then
        return grant('granted', s, nil, asker)
      end
      local _, _, entry = taker('t' .. s)
      return grant('takeover', s, entry, asker)
    end
    if live(h[3], h[4]) then
      return { 'wait' }
    end
  elseif serving == n then
    return grant('granted', s, nil, asker)
  else
    local w, i = taker('t' .. s)
    local since = tonumber(redis.call('HGET', KEYS[3], 'ss') or '0')
    if w and live(w, i) and ms_now - since < tonumber(ARGV[8]) then
      return { 'wait' }
    end
  end
  local _, _, entry = taker('t' .. s)
  return grant('takeover', s, entry, asker)
end

if ARGV[1] ~= 'release' and not live(me, inc) then
  if ARGV[1] == 'take' then
    return { '0', 'notlive' }
  end
  return { 'notlive' }
end
if ARGV[1] == 'take' then
  local have = redis.call('HGET', KEYS[3], 'e' .. ARGV[4])
  if have and redis.call('HEXISTS', KEYS[3], 't' .. have) == 1 then
    local r = try(have)
    table.insert(r, 1, have)
    return r
  end
  if redis.call('HEXISTS', KEYS[3], 'next') == 0 then
    local base = string.format('%d', us_now)
    redis.call('HSET', KEYS[3], 'next', base, 'serving', base, 'ss', string.format('%d', ms_now))
  end
  local n = redis.call('HINCRBY', KEYS[3], 'next', 1) - 1
  local s = string.format('%d', n)
  redis.call('HSET', KEYS[3], 't' .. s, me .. '|' .. inc .. '|' .. ARGV[4], 'e' .. ARGV[4], s)
  -- A forgotten queue: a safety net against keys left by a fleet that went away.
  redis.call('PEXPIRE', KEYS[3], 86400000)
  local r = try(s)
  table.insert(r, 1, s)
  return r
elseif ARGV[1] == 'try' then
  return try(ARGV[4])
end
-- release
local h = redis.call('HMGET', KEYS[3], 'next', 'serving', 'hw', 'hi', 'f')
if h[3] ~= me or h[4] ~= inc or h[2] ~= ARGV[4] or h[5] ~= ARGV[5] then
  return { '0' }
end
local serving = tonumber(h[2]) + 1
local _, _, served = taker('t' .. h[2])
if served then
  redis.call('HDEL', KEYS[3], 'e' .. served)
end
redis.call('HDEL', KEYS[3], 't' .. h[2], 'hw', 'hi', 'hk')
if serving >= tonumber(h[1]) then
  -- Nothing waits: forget the chat (its fences stay above by the clock).
  redis.call('DEL', KEYS[3])
  return { '1', bump() }
end
local s = string.format('%d', serving)
redis.call('HSET', KEYS[3], 'serving', s, 'ss', string.format('%d', ms_now))
local w = taker('t' .. s)
if w then
  redis.call('PUBLISH', ARGV[6] .. w, ARGV[7])
end
return { '1', bump() }
