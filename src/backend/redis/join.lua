-- join: one call per visitor's join. ARGV[3] = identity (hex) or '';
-- ARGV[4], ARGV[5] = the epoch and id of the ticket the visitor carries,
-- or ''; ARGV[6] = '1' to issue a new ticket when that one has ended ('0'
-- answers with it); ARGV[7] = the client address the join limit counts, or
-- ''; ARGV[8] = the start of the join window (rules::join_window_start);
-- ARGV[9] = '1' when the room's access rules refuse this join a new ticket
-- (it lacks a proof of work or an enqueue token); ARGV[10], ARGV[11] = the
-- proof-of-work nonce (hex) a new ticket spends and how long to remember
-- it (ms), or ''; ARGV[12] = the lane a new ticket queues in (one out of
-- the room's range queues in its default lane); ARGV[13] = '1' when the
-- identity answers its ticket only while it lives (an Idempotency-Key,
-- engine Binding::WhileLive: once the ticket ended the identity makes a
-- new one), '0' when for good (an enqueue token's account).
--
-- A carried live ticket is kept (and counts as a sign of life); a known
-- identity gets its ticket back; only a join that makes a new ticket counts
-- against the address.
--
-- Returns {r = 'ok', id, new, epoch, t = facts, w = waiting}
--       | {r = 'limited', n = joins in the window, oldest, limit}
--       | {r = 'denied'} | {r = 'spent'}
--       | {r = 'closed'} | {r = 'soldout'} | {r = 'full'} | {r = 'noroom'} | {r = 'reset'}
--
-- In mode passthrough the new ticket (and anyone still in line) is
-- admitted in the same step.
if not room({'closed', 'open', 'paused', 'mode', 'issued', 'waiting', 'join_limit', 'debt',
    'peak'}) then
  return reply({r = 'noroom'})
end

local function answer(t, new)
  local ahead = ahead_of(t)
  if t.dirty then save_ticket(t) end
  return reply({r = 'ok', id = t.id, new = new, epoch = EPOCH, t = facts(t, ahead),
    w = n('waiting')})
end

-- A carried ticket of another incarnation stood in a line that was reset.
if ARGV[4] ~= '' and ARGV[4] ~= EPOCH and ARGV[6] ~= '1' then return reply({r = 'reset'}) end
if ARGV[4] == EPOCH and tonumber(ARGV[5]) < n('issued') then
  local t = load_ticket(ARGV[5])
  if t and (t.state == WAITING or t.state == ADMITTED or t.state == AWAY
      or ARGV[6] ~= '1') then
    touch(t)
    return answer(t, false)
  end
end
if M['closed'] == '1' then return reply({r = 'closed'}) end
if MODE_CLOSES[mode()] then return reply({r = 'soldout'}) end
local identity = ARGV[3]
if identity ~= '' then
  local existing = redis.call('HGET', K('ids'), identity)
  if existing then
    local t = load_ticket(existing)
    if ARGV[13] ~= '1' or (t and LIVE[t.state]) then
      return answer(t, false)
    end
  end
end
if n('issued') >= MAX_TICKETS then return reply({r = 'full'}) end
if ARGV[9] == '1' then return reply({r = 'denied'}) end

-- The join limit, a bounded insert into the address's log: counted
-- untrimmed first (a log under the limit is under it whatever has aged
-- out), trimmed only when that count reaches the limit.
local limit = n('join_limit')
local log = nil
if limit > 0 and ARGV[7] ~= '' then
  log = P .. 'jl:' .. ARGV[7]
  local count = redis.call('ZCARD', log)
  if count >= limit then
    count = count - redis.call('ZREMRANGEBYSCORE', log, '-inf', ARGV[8])
    if count >= limit then
      local oldest = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
      return reply({r = 'limited', n = count, oldest = tonumber(oldest[2]), limit = limit})
    end
  end
end

-- One solution, one new ticket: the nonce is remembered (add-if-absent,
-- expiring with its challenge) in the same step that issues the ticket,
-- on the room's slot, so a replay on any instance finds it.
if ARGV[10] ~= '' then
  if not redis.call('SET', P .. 'pow:' .. ARGV[10], '1', 'NX', 'PX', ARGV[11]) then
    return reply({r = 'spent'})
  end
end

local id = n('issued')
local waiting = n('waiting')
redis.call('HSET', META, 'issued', S(id + 1), 'waiting', S(waiting + 1))
M['waiting'] = S(waiting + 1)
local lane = 0
if LANED then
  lane = tonumber(ARGV[12]) or -1
  if lane < 0 or lane >= LANES or lane ~= math.floor(lane) then lane = n('lane_def') end
end
local t = {id = id, state = WAITING, qi = -1, joined = NOW, admat = 0, seen = NOW, arrived = 0,
  shown = NONE_SHOWN, init = 0, lane = lane}
-- Those ahead of the new ticket: everyone waiting in its lane.
local ahead = waiting
if LANED then
  ahead = n('lw' .. lane)
  incr('lw' .. lane, 1)
end
if M['open'] == '1' then
  -- Every ticket issued before opening was placed at the opening, so in an
  -- open room without lanes a new ticket's queue index is its id; with
  -- lanes it is the next of its lane. Everyone waiting in its lane is
  -- ahead of it.
  t.qi = id
  if LANED then t.qi = incr('lq' .. lane, 1) - 1 end
  t.init = ahead
  t.shown = ahead
  redis.call('ZADD', LK('q', lane), t.qi, S(id))
  redis.call('ZADD', K('seen'), NOW, S(id))
else
  redis.call('RPUSH', K('pre'), S(id))
  -- Followers place the pre-queue at the opening by this: in a room with
  -- lanes each lane numbers its own line, so a drawn ticket's id no longer
  -- tells its queue index. (A ticket joining an open room learns its index
  -- from its own read.)
  if LANED then redis.call('SETRANGE', K('ln'), id, string.char(lane)) end
end
save_ticket(t)
if identity ~= '' then redis.call('HSET', K('ids'), identity, S(id)) end
if log then
  redis.call('ZADD', log, NOW, EPOCH .. ':' .. S(id))
  redis.call('PEXPIRE', log, JOIN_WINDOW_MS)
end
if t.qi >= 0 and MODE_ADMITS_EVERYONE[mode()] and admitting() then
  -- Nobody in line is quiet here: the tick admits everyone each turn.
  admit_everyone(0, 0)
  t = load_ticket(S(id))
  return reply({r = 'ok', id = id, new = true, epoch = EPOCH, t = facts(t, nil),
    w = n('waiting')})
end
return reply({r = 'ok', id = id, new = true, epoch = EPOCH, t = facts(t, t.shown), w = waiting + 1})
