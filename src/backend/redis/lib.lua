-- Shared by every room script: put after the constants generated from the
-- Rust rules (src/engine/rules) and before the script's own body.
--
-- KEYS[1] is the room's meta hash `narabu:{room}:room`; ARGV[1] the key
-- prefix `narabu:{room}:`; ARGV[2] "now" in Unix ms from the calling
-- instance's clock. Every script answers with one cjson-encoded table of
-- named fields, which the Rust side decodes into a struct.
--
-- Keys of one incarnation (epoch) of a room, all built from the prefix:
--   tk    hash: ticket id -> packed record (RECORD below)
--   q     sorted set: waiting tickets placed in the queue, by queue index
--   pre   list: the pre-queue (tickets that joined before opening)
--   ids   hash: identity -> ticket id
--   seen  sorted set: waiting and away tickets, by their last sign of life
--         (the instances' batched presence renewals write only this)
--   back  sorted set: away tickets whose visitor came back, by queue index
--         (they stand ahead of `q`)
--   away  sorted set: tickets skipped at the head while away, by queue index
--   adm   sorted set: admitted tickets not yet arrived, by admission time
--   pas   sorted set: admitted tickets that arrived, by their last activity
--   ln    string: each pre-queue ticket's lane, one byte per ticket id
--         (rooms with lanes only: what a follower places the opening by)
-- A room with priority lanes keeps one line per lane: lane 0 in the keys
-- above (`q`, `back`, `away`, `dep`), so a room without lanes and data
-- stored before lanes existed read the same, and lane l >= 1 in the same
-- names suffixed `:<l>` (LK below). Its meta hash then holds `lanes` (how
-- many), `lane_def` (the default lane's index), and per lane l `lane_n<l>`
-- (name), `lane_w<l>` (weight), `lq<l>` (the next queue index), `la<l>`
-- (permits held) and `lw<l>` (tickets waiting).
-- and of the room whatever its epoch:
--   jl:<address>  sorted set: the address's joins in the last window
local META = KEYS[1]
local P = ARGV[1]
local NOW = tonumber(ARGV[2])
local ROOM = string.sub(P, 9, -3)
local CHANNEL = 'narabu:events'
-- Entries the change log keeps at most (trimmed roughly, as Redis does
-- cheaply): a follower further behind than this reloads a snapshot.
local LOG_MAX = 10000

local function S(x) return string.format('%.0f', x) end

local M = {}
local function load_meta(fields)
  local vals = redis.call('HMGET', META, unpack(fields))
  for i, f in ipairs(fields) do M[f] = vals[i] end
end
local function n(f) return tonumber(M[f]) or 0 end
local function incr(f, by)
  M[f] = S(redis.call('HINCRBY', META, f, by))
  return tonumber(M[f])
end
local function set(f, v)
  M[f] = v
  redis.call('HSET', META, f, v)
end
local EPOCH
local function K(name) return P .. EPOCH .. ':' .. name end
-- A key of one lane's line: lane 0 keeps the names a room without lanes has.
local function LK(name, lane)
  if lane == 0 then return K(name) end
  return K(name .. ':' .. lane)
end
-- How many lines the room keeps, and whether it has lanes at all (a room
-- without them keeps no per-lane counters, exactly as before lanes).
local LANES, LANED = 1, false

-- The room's change log (a Redis Stream, one per room whatever its epoch):
-- every instance follows it to keep its own copy of the line's position
-- index and to wake the streams of the tickets it names. A script collects
-- what it changed as events and `reply` appends them as ONE entry, so the
-- log moves atomically with the state; each entry carries the next `seq`,
-- so a follower that misses one (the log was trimmed past it) knows.
-- Events, lane first, then the queue index (within the lane) and the ticket:
--   {'p', lane, qi, id, 'adm'|'away'|'gone'}  the head took qi
--   {'d', lane, qi, id, state}  a waiting ticket left (qi -1: never placed)
--   {'b', lane, qi, id}         a skipped ticket came back
--   {'e', lane, qi, id, state}  a ticket out of the line ended
--   {'o', lane, drawn, placed}  the opening placed the pre-queue (one per lane)
local LOG = P .. 'log'
local EVENTS = {}
local function log_event(ev) EVENTS[#EVENTS + 1] = ev end
local function log_pop(t, outcome) log_event({'p', t.lane, t.qi, t.id, outcome}) end
local function log_back(t) log_event({'b', t.lane, t.qi, t.id}) end
local function log_end(t) log_event({'e', t.lane, t.qi, t.id, t.state}) end
local function log_open(lane, drawn, placed) log_event({'o', lane, drawn, placed}) end

-- A departure also sets the slot's bit in the lane's departed bitmap, so a
-- follower that starts late reads the line in one GETRANGE.
local function log_dep(t)
  if t.qi >= 0 then redis.call('SETBIT', LK('dep', t.lane), t.qi, 1) end
  log_event({'d', t.lane, t.qi, t.id, t.state})
end
local function append_log(field, value)
  local seq = redis.call('INCR', P .. 'lseq')
  redis.call('XADD', LOG, 'MAXLEN', '~', LOG_MAX, '*', 's', seq, field, value)
end
local function reply(t)
  if #EVENTS > 0 then
    append_log('e', cjson.encode(EVENTS))
    EVENTS = {}
  end
  return cjson.encode(t)
end

-- Loads the epoch and the given meta fields (and, in a room with lanes,
-- every lane's counters and weight); false when there is no room.
local function room(fields)
  table.insert(fields, 'epoch')
  table.insert(fields, 'lanes')
  table.insert(fields, 'lane_def')
  load_meta(fields)
  EPOCH = M['epoch']
  local lanes = n('lanes')
  if lanes > 0 then
    LANES, LANED = lanes, true
    local per = {}
    for l = 0, lanes - 1 do
      for _, f in ipairs({'la', 'lw', 'lq', 'lane_w'}) do per[#per + 1] = f .. l end
    end
    load_meta(per)
  end
  return EPOCH ~= false and EPOCH ~= nil
end

-- A per-lane counter moves with the room-wide one it splits.
local function lane_incr(f, lane, by)
  if LANED then incr(f .. lane, by) end
end

-- A ticket record, packed: state, queue index (-1: not placed yet),
-- joined at, admitted at, last seen, arrived (0/1), the fewest tickets
-- ahead shown so far (so a position never goes up), tickets ahead when
-- placed (for the progress bar); then, only in a lane other than 0, the
-- lane (a record without it, as every record stored before lanes existed,
-- is of lane 0).
local RECORD = '<BidddBII'
local RECORD_LANE = RECORD .. 'B'
local RECORD_SIZE = struct.size(RECORD)
local NONE_SHOWN = 4294967295

local function load_ticket(id)
  local raw = redis.call('HGET', K('tk'), id)
  if not raw then return nil end
  local s, q, j, a, l, v, h, i, ln
  if #raw > RECORD_SIZE then
    s, q, j, a, l, v, h, i, ln = struct.unpack(RECORD_LANE, raw)
  else
    s, q, j, a, l, v, h, i = struct.unpack(RECORD, raw)
    ln = 0
  end
  return {id = tonumber(id), state = s, qi = q, joined = j, admat = a, seen = l,
    arrived = v, shown = h, init = i, lane = ln}
end

local function save_ticket(t)
  local raw
  if t.lane > 0 then
    raw = struct.pack(RECORD_LANE, t.state, t.qi, t.joined, t.admat, t.seen, t.arrived,
      t.shown, t.init, t.lane)
  else
    raw = struct.pack(RECORD, t.state, t.qi, t.joined, t.admat, t.seen, t.arrived, t.shown,
      t.init)
  end
  redis.call('HSET', K('tk'), S(t.id), raw)
end

-- The ticket as the Rust side's status computation takes it
-- (rules::TicketFacts), with the tickets still waiting ahead.
local function facts(t, ahead)
  local q = nil
  if t.qi >= 0 then q = t.qi end
  return {id = t.id, s = t.state, q = q, j = t.joined, a = t.admat, l = t.seen,
    v = t.arrived == 1, i = t.init, h = ahead, ln = t.lane}
end

-- Tickets still waiting ahead of a waiting, placed ticket in its lane: its
-- rank among the lane's returners, or all of them and its rank in the
-- lane's queue; never more than was shown before.
local function ahead_of(t)
  if t.state ~= WAITING or t.qi < 0 then return nil end
  local back = LK('back', t.lane)
  local rank = redis.call('ZRANK', back, S(t.id))
  if not rank then
    rank = redis.call('ZRANK', LK('q', t.lane), S(t.id))
    if not rank then return nil end
    rank = rank + redis.call('ZCARD', back)
  end
  if rank < t.shown then
    t.shown = rank
    t.dirty = true
  end
  return t.shown
end

-- An away ticket's visitor is back: ahead of the whole queue (everyone in
-- it joined later).
local function come_back(t)
  t.state = WAITING
  t.dirty = true
  redis.call('ZREM', LK('away', t.lane), S(t.id))
  redis.call('ZADD', LK('back', t.lane), t.qi, S(t.id))
  incr('waiting', 1)
  lane_incr('lw', t.lane, 1)
  incr('c_returns', 1)
  log_back(t)
end

-- A sign of life: on a waiting ticket it keeps its place; on an admitted
-- one it is its arrival and renews its pass; an away one is back.
local function touch(t)
  if t.state == AWAY then
    come_back(t)
  end
  if t.state ~= WAITING and t.state ~= ADMITTED then return end
  if NOW > t.seen then t.seen = NOW end
  if t.state == ADMITTED then
    if t.arrived == 0 then
      t.arrived = 1
      redis.call('ZREM', K('adm'), S(t.id))
    end
    redis.call('ZADD', K('pas'), t.seen, S(t.id))
  elseif t.qi >= 0 then
    redis.call('ZADD', K('seen'), 'XX', t.seen, S(t.id))
  end
  t.dirty = true
end

-- Timeouts the caller computed its cutoffs with must be the room's: else
-- the answer is 'stale' with the room's, and the caller asks again.
-- (`away` is compared with what a room made before presence existed has:
-- nothing, read as '0'.)
local function stale(queue_idle, pass_idle, grace, away)
  if (queue_idle == nil or queue_idle == M['queue_idle_ms'])
      and (pass_idle == nil or pass_idle == M['pass_idle_ms'])
      and (grace == nil or grace == M['arrival_grace_ms'])
      and (away == nil or away == (M['away_grace_ms'] or '0')) then
    return nil
  end
  return reply({r = 'stale', queue_idle_ms = n('queue_idle_ms'),
    pass_idle_ms = n('pass_idle_ms'), arrival_grace_ms = n('arrival_grace_ms'),
    away_grace_ms = n('away_grace_ms')})
end

-- A waiting (or away) ticket leaves the line: on its own (a leave, a
-- revocation, the quiet sweep) or, `popped`, when the head reached it.
local function left_waiting(t, to, popped)
  local was = t.state
  t.state = to
  save_ticket(t)
  redis.call('ZREM', LK('q', t.lane), S(t.id))
  redis.call('ZREM', K('seen'), S(t.id))
  redis.call('ZREM', LK('back', t.lane), S(t.id))
  redis.call('ZREM', LK('away', t.lane), S(t.id))
  -- An away ticket was counted out of the line when it was skipped.
  if was == WAITING then
    incr('waiting', -1)
    lane_incr('lw', t.lane, -1)
  end
  incr(ENDED_COUNTER[to], 1)
  if popped then log_pop(t, 'gone') else log_dep(t) end
end

local function record_wait(ms)
  local b = #WAIT_BUCKETS + 1
  for i, bound in ipairs(WAIT_BUCKETS) do
    if ms <= bound then b = i break end
  end
  redis.call('HINCRBY', META, 'w' .. b, 1)
  redis.call('HINCRBY', META, 'w_sum', ms)
end

-- The admission cap's one atomic step: advance the stored theoretical
-- arrival time by the interval if it runs no further than the tolerance
-- ahead of now. What interval and tolerance a cap means is decided by
-- rules::AdmitCap, which wrote them into the room.
local function take_slot()
  local interval = n('cap_interval_us')
  if interval <= 0 then return true end
  local now = NOW * 1000
  local start = math.max(n('tat_us'), now)
  if start - now > n('cap_tolerance_us') then return false end
  set('tat_us', S(start + interval))
  return true
end

-- Whether anyone may be at a lane's head: in its queue, or back from away.
local function queued_in(lane)
  return redis.call('ZCARD', LK('q', lane)) + redis.call('ZCARD', LK('back', lane)) > 0
end

-- Whether anyone may be at the head of any lane.
local function queued()
  for l = 0, LANES - 1 do
    if queued_in(l) then return true end
  end
  return false
end

-- The next ticket at a lane's head: a returner first (lowest number), else
-- the queue's head.
local function claim_head(lane)
  local head = redis.call('ZPOPMIN', LK('back', lane))
  if #head == 0 then head = redis.call('ZPOPMIN', LK('q', lane)) end
  return head[1]
end

-- The head passed a ticket whose visitor is away: it keeps its number, out
-- of the line, until its visitor comes back (or stays quiet past
-- queue_idle: the sweep abandons it from `seen`).
local function skip(t)
  t.state = AWAY
  save_ticket(t)
  redis.call('ZADD', LK('away', t.lane), t.qi, S(t.id))
  incr('waiting', -1)
  lane_incr('lw', t.lane, -1)
  incr('c_skips', 1)
  log_pop(t, 'away')
end

-- Claims the head of a lane's queue and admits it. Met on the way, tickets
-- last seen before `quiet_before` are abandoned and those last seen before
-- `away_before` are skipped (rules::PresenceTimeouts::at_head gives both
-- cutoffs). Returns the admitted id or nil.
local function pop_and_admit_in(lane, quiet_before, away_before)
  away_before = away_before or 0
  while true do
    local sid = claim_head(lane)
    if not sid then return nil end
    local t = load_ticket(sid)
    if t and t.state == WAITING then
      -- Renewals write only `seen`'s score.
      local score = tonumber(redis.call('ZSCORE', K('seen'), sid))
      if score and score > t.seen then t.seen = score end
      if t.seen < quiet_before then
        left_waiting(t, ABANDONED, true)
      elseif t.seen < away_before then
        skip(t)
      else
        t.state = ADMITTED
        t.admat = NOW
        save_ticket(t)
        redis.call('ZREM', K('seen'), S(t.id))
        redis.call('ZADD', K('adm'), NOW, S(t.id))
        local admitted = incr('admitted', 1)
        if admitted > n('peak') then set('peak', S(admitted)) end
        incr('waiting', -1)
        lane_incr('la', t.lane, 1)
        lane_incr('lw', t.lane, -1)
        incr('c_admissions', 1)
        record_wait(math.max(NOW - t.joined, 0))
        log_pop(t, 'adm')
        return t.id
      end
    end
  end
end

-- Admits the next ticket on a free permit: from the lane the rule
-- (rules::lanes, `lane_before`) gives it to among those with someone
-- queued, and should that lane's head hold nobody admissible, from the
-- next lane in the rule's order. Returns the admitted id or nil.
local function pop_and_admit(quiet_before, away_before)
  if LANES == 1 then return pop_and_admit_in(0, quiet_before, away_before) end
  local tried = {}
  while true do
    local best = nil
    for l = 0, LANES - 1 do
      if not tried[l] and queued_in(l) and (best == nil
          or lane_before(n('la' .. l), n('lane_w' .. l), n('la' .. best), n('lane_w' .. best))) then
        best = l
      end
    end
    if best == nil then return nil end
    local id = pop_and_admit_in(best, quiet_before, away_before)
    if id then return id end
    tried[best] = true
  end
end

-- The room's mode (rules::Mode), by name; a room stored before modes
-- existed queues.
local function mode() return M['mode'] or MODE_DEFAULT end

-- Whether permits go to the line now: open, not paused, and a mode that
-- admits. Needs 'open', 'paused' and 'mode' loaded.
local function admitting()
  return M['open'] == '1' and M['paused'] ~= '1' and MODE_ADMITS[mode()] == true
end

-- A permit comes back: pay capacity debt, else hand it to the head, else
-- the tray. Returns 'retired' | 'to', id | 'tray'.
local function give_back(quiet_before, away_before)
  if n('debt') > 0 then
    incr('debt', -1)
    return 'retired'
  end
  if admitting() and queued() and take_slot() then
    local id = pop_and_admit(quiet_before, away_before)
    if id then
      incr('c_handoffs', 1)
      return 'to', id
    end
  end
  incr('tray', 1)
  return 'tray'
end

-- passthrough: admit everyone in line, in order, each on a permit
-- borrowed as debt (rules::Mode) that the tick pays from the hand and
-- finishers by retiring theirs. Returns the admitted ids.
local function admit_everyone(quiet_before, away_before)
  local ids = {}
  while queued() do
    local id = pop_and_admit(quiet_before, away_before)
    if not id then break end
    incr('debt', 1)
    ids[#ids + 1] = id
  end
  return ids
end

-- The room as stored, for the Rust side to build and publish its view
-- from (with `chg`, the change it reflects).
local VIEW_FIELDS = {'capacity', 'waiting', 'admitted', 'hand', 'tray', 'debt', 'paused',
  'open', 'closed', 'mode', 'stock', 'opens_at', 'commitment', 'seed', 'rate_mean', 'rate_var', 'rate_primed',
  'c_admissions', 'tick_ms', 'pass_idle_ms', 'arrival_grace_ms', 'chg'}

local function view_fields()
  local fields = {unpack(VIEW_FIELDS)}
  if LANED then
    fields[#fields + 1] = 'lanes'
    for l = 0, LANES - 1 do
      for _, f in ipairs({'lane_n', 'lane_w', 'la', 'lw'}) do fields[#fields + 1] = f .. l end
    end
  end
  load_meta(fields)
  local v = {}
  for _, f in ipairs(fields) do v[f] = M[f] or nil end
  v.epoch = EPOCH
  return v
end

-- A change an operator made (or a tick): the sequence number views are
-- ordered by, so an older view never replaces a newer one.
local function changed() return incr('chg', 1) end
