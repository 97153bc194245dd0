-- Shared by every room script (prepended to each). KEYS[1] is the room's
-- meta hash `narabu:{room}:room`; ARGV[1] the key prefix `narabu:{room}:`;
-- ARGV[2] "now" in Unix ms from the calling instance's clock.
-- Ticket records live in one hash per room incarnation, field = ticket id,
-- value = "state:qi:joined:admitted_at:last_seen:arrived:reported:initial".
-- States: 0 waiting, 1 admitted, 2 released, 3 revoked, 4 expired, 5 left,
-- 6 abandoned (the engine's TicketState discriminants).
local META = KEYS[1]
local P = ARGV[1]
local NOW = tonumber(ARGV[2])
local ROOM = string.sub(P, 9, -3)
local CHANNEL = 'narabu:events'
local MAX_TICKETS = 67104768
local WAIT_BUCKETS = {100, 500, 1000, 2000, 5000, 10000, 30000, 60000, 120000,
  300000, 600000, 1800000, 3600000}

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

-- Loads the epoch and the given meta fields; false when there is no room.
local function room(fields)
  table.insert(fields, 'epoch')
  load_meta(fields)
  EPOCH = M['epoch']
  return EPOCH ~= false and EPOCH ~= nil
end

local function load_ticket(id)
  local raw = redis.call('HGET', K('tk'), id)
  if not raw then return nil end
  local f = {}
  for part in string.gmatch(raw, '[^:]+') do f[#f + 1] = tonumber(part) end
  return {id = tonumber(id), state = f[1], qi = f[2], joined = f[3], admat = f[4],
    seen = f[5], arrived = f[6], reported = f[7], init = f[8]}
end

local function save_ticket(t)
  redis.call('HSET', K('tk'), S(t.id), table.concat({S(t.state), S(t.qi),
    S(t.joined), S(t.admat), S(t.seen), S(t.arrived), S(t.reported), S(t.init)}, ':'))
end

local function notify(id)
  redis.call('PUBLISH', CHANNEL, 't|' .. ROOM .. '|' .. EPOCH .. '|' .. S(id))
end

-- When an admitted ticket's pass lapses without more activity.
local function deadline(t)
  if t.arrived == 1 then return t.seen + n('pass_idle_ms') end
  return t.admat + n('arrival_grace_ms')
end

-- GCRA on `tat_us`, as engine::rate::AdmitLimiter.
local function try_take()
  local per_minute = n('admit_cap')
  if per_minute <= 0 then return true end
  local interval = math.floor(60000000 / per_minute)
  local burst = math.max(math.floor(per_minute / 60), 1)
  local tolerance = interval * (burst - 1)
  local now = NOW * 1000
  local start = math.max(tonumber(redis.call('HGET', META, 'tat_us') or '0') or 0, now)
  if start - now > tolerance then return false end
  redis.call('HSET', META, 'tat_us', S(start + interval))
  return true
end

-- Appends a ticket to the queue (a sorted set scored by queue index, so a
-- waiting ticket's rank is exactly the number of live tickets ahead).
local function enqueue(t)
  local qi = incr('qtail', 1) - 1
  t.qi = qi
  if t.state == 0 then
    redis.call('ZADD', K('q'), qi, S(t.id))
    t.init = redis.call('ZCARD', K('q')) - 1
    redis.call('ZADD', K('seen'), t.seen, S(t.id))
  end
  save_ticket(t)
end

local function left_waiting(t, to)
  t.state = to
  save_ticket(t)
  redis.call('ZREM', K('q'), S(t.id))
  redis.call('ZREM', K('seen'), S(t.id))
  incr('waiting', -1)
  local counter = 'c_leaves'
  if to == 6 then counter = 'c_abandonments' elseif to == 3 then counter = 'c_revocations' end
  incr(counter, 1)
  notify(t.id)
end

local function record_wait(ms)
  local b = #WAIT_BUCKETS + 1
  for i, bound in ipairs(WAIT_BUCKETS) do
    if ms <= bound then b = i break end
  end
  redis.call('HINCRBY', META, 'w' .. b, 1)
  redis.call('HINCRBY', META, 'w_sum', ms)
end

-- Claims the head of the queue and admits it; quiet tickets met on the
-- way are abandoned and skipped. Returns the admitted id or nil.
local function pop_and_admit()
  local idle = n('queue_idle_ms')
  while true do
    local head = redis.call('ZPOPMIN', K('q'))
    if #head == 0 then return nil end
    local t = load_ticket(head[1])
    if t and t.state == 0 then
      if t.seen + idle < NOW then
        left_waiting(t, 6)
      else
        t.state = 1
        t.admat = NOW
        save_ticket(t)
        redis.call('ZREM', K('seen'), S(t.id))
        redis.call('ZADD', K('adm'), deadline(t), S(t.id))
        local admitted = incr('admitted', 1)
        if admitted > n('peak') then set('peak', S(admitted)) end
        incr('waiting', -1)
        incr('c_admissions', 1)
        record_wait(math.max(NOW - t.joined, 0))
        notify(t.id)
        return t.id
      end
    end
  end
end

-- A permit comes back: pay capacity debt, else hand it to the head, else
-- the tray. Returns 'retired' | 'to', id | 'tray'.
local function give_back()
  local debt = n('debt')
  if debt > 0 then
    incr('debt', -1)
    return 'retired'
  end
  if M['open'] == '1' and M['paused'] ~= '1' and redis.call('ZCARD', K('q')) > 0
      and try_take() then
    local id = pop_and_admit()
    if id then
      incr('c_handoffs', 1)
      return 'to', id
    end
  end
  incr('tray', 1)
  return 'tray'
end

-- Publishes the room view if anything visible changed (or `force`).
local function publish_view(force)
  load_meta({'capacity', 'waiting', 'admitted', 'hand', 'tray', 'debt', 'paused', 'open',
    'closed', 'opens_at', 'commitment', 'seed', 'rate_mean', 'rate_var', 'rate_primed',
    'c_admissions', 'view_sig', 'view_version', 'join_limit'})
  local open = M['open'] == '1'
  local seed = cjson.null
  if open and M['seed'] and M['seed'] ~= '' then seed = M['seed'] end
  local commitment = cjson.null
  if M['commitment'] and M['commitment'] ~= '' then commitment = M['commitment'] end
  local opens_at = cjson.null
  if M['opens_at'] and M['opens_at'] ~= '' then opens_at = M['opens_at'] end
  local body = {capacity = n('capacity'), waiting = n('waiting'), admitted = n('admitted'),
    held = n('hand'), tray = n('tray'), debt = n('debt'), paused = M['paused'] == '1',
    open = open, closed = M['closed'] == '1', opens_at = opens_at,
    lottery_commitment = commitment, lottery_seed = seed,
    rate_mean = M['rate_mean'] or '0', rate_var = M['rate_var'] or '0',
    rate_primed = M['rate_primed'] == '1', admissions_total = n('c_admissions'),
    join_limit_per_minute = n('join_limit')}
  -- As RoomView::differs_from: the smoothed rate drifts on every tick, even
  -- in a quiet room, and republishing for that alone would wake every
  -- waiting stream on every instance each tick. The signature keeps only
  -- the rate's 25% band (log scale; under one a minute is one band) and
  -- whether it is primed: the same rule as `rate_band` in
  -- src/engine/view.rs, which must change with it.
  local published_mean, published_var = body.rate_mean, body.rate_var
  local mean = tonumber(body.rate_mean) or 0
  local band = 'idle'
  if mean >= 1 / 60 then band = math.floor(math.log(mean) / math.log(1.25)) end
  body.rate_mean, body.rate_var, body.rate_band = nil, nil, band
  local sig = cjson.encode(body)
  body.rate_mean, body.rate_var, body.rate_band = published_mean, published_var, nil
  if not force and sig == M['view_sig'] then return end
  body.version = incr('view_version', 1)
  body.at_ms = S(NOW)
  local view = cjson.encode(body)
  redis.call('HSET', META, 'view_sig', sig, 'view', view)
  redis.call('PUBLISH', CHANNEL, 'v|' .. ROOM .. '|' .. EPOCH .. '|' .. view)
end

-- What a ticket's holder sees: the raw fields, turned into a TicketStatus
-- by the Rust side. Positions never go up (clamped by `reported`). With
-- `defer`, a lowered `reported` is only marked (t.dirty) for the caller to
-- save with its own changes: one write per ticket instead of two.
local function status_reply(t, defer)
  local position = -1
  if t.state == 0 and t.qi >= 0 then
    local rank = redis.call('ZRANK', K('q'), S(t.id))
    if rank then
      local computed = rank + 1
      if computed < t.reported then
        t.reported = computed
        if defer then t.dirty = true else save_ticket(t) end
      end
      position = t.reported
    end
  end
  local pass_expires = -1
  if t.state == 1 then pass_expires = deadline(t) end
  local opens_at = -1
  if M['open'] ~= '1' and M['opens_at'] and M['opens_at'] ~= '' then
    opens_at = tonumber(M['opens_at'])
  end
  return {t.state, t.qi, t.joined, t.admat, pass_expires, position, t.init,
    n('waiting'), n('open'), opens_at, n('paused'), n('closed'), n('hand'), n('tray'),
    M['rate_mean'] or '0', M['rate_var'] or '0', n('rate_primed'), n('tick_ms')}
end

local STATUS_FIELDS = {'waiting', 'open', 'opens_at', 'paused', 'closed', 'hand', 'tray',
  'rate_mean', 'rate_var', 'rate_primed', 'tick_ms', 'pass_idle_ms', 'arrival_grace_ms',
  'queue_idle_ms', 'issued'}

local function ticket_of(ticket_epoch, id)
  if ticket_epoch ~= EPOCH then return nil end
  if tonumber(id) >= n('issued') then return nil end
  return load_ticket(id)
end
