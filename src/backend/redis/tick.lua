-- tick: one turn of the room's worker. ARGV[3] = the worker's lease owner
-- token, checked against `lease` so that a worker that lost its lease
-- (paused past expiry) cannot admit beside the new one; '' skips the check
-- (an operator's or a test's tick). ARGV[4] = admitted-but-never-arrived
-- cutoff, ARGV[5] = idle-pass cutoff, ARGV[6] = quiet cutoff
-- (rules::PassTimeouts::cutoffs, rules::quiet_cutoff), ARGV[7..9] = the
-- queue_idle, pass_idle and arrival_grace they were computed with,
-- ARGV[10] = the away cutoff (rules::away_cutoff), ARGV[11] = the
-- away_grace it was computed with.
-- Returns {r = 'notowner'} | {r = 'open_needed'} | {r = 'noroom'} | {r = 'stale', ...}
--       | {r = 'ok', closed = true, tick_ms}
--       | {r = 'ok', tick_ms, from_tray, abandoned, admitted = [ids], expired = [ids],
--          total, prev_total, prev_at, view = {...}}
if ARGV[3] ~= '' and redis.call('GET', P .. 'lease') ~= ARGV[3] then
  return reply({r = 'notowner'})
end
if not room({'closed', 'open', 'opens_at', 'paused', 'mode', 'hand', 'tray', 'debt', 'cap_interval_us',
    'cap_tolerance_us', 'tat_us', 'queue_idle_ms', 'pass_idle_ms', 'arrival_grace_ms', 'tick_ms',
    'peak', 'c_admissions', 'last_tick_ms', 'adm_at_last_tick', 'away_grace_ms'}) then
  return reply({r = 'noroom'})
end
local again = stale(ARGV[7], ARGV[8], ARGV[9], ARGV[11])
if again then return again end
if M['closed'] == '1' then return reply({r = 'ok', closed = true, tick_ms = n('tick_ms')}) end
if M['open'] ~= '1' and M['opens_at'] and M['opens_at'] ~= ''
    and tonumber(M['opens_at']) <= NOW then
  return reply({r = 'open_needed'})
end

-- Take back stalled permits: admitted and never arrived since before the
-- first cutoff, or arrived and idle since before the second.
local expired = {}
for _, stalled in ipairs({{'adm', ARGV[4]}, {'pas', ARGV[5]}}) do
  local due = redis.call('ZRANGEBYSCORE', K(stalled[1]), '-inf', '(' .. stalled[2])
  for _, sid in ipairs(due) do
    redis.call('ZREM', K(stalled[1]), sid)
    local t = load_ticket(sid)
    if t and t.state == ADMITTED then
      t.state = EXPIRED
      save_ticket(t)
      incr('admitted', -1)
      lane_incr('la', t.lane, -1)
      incr(ENDED_COUNTER[EXPIRED], 1)
      incr('hand', 1)
      expired[#expired + 1] = t.id
      log_end(t)
    end
  end
end

local function pay_debt()
  local paid = math.min(n('debt'), n('hand'))
  if paid > 0 then
    incr('debt', -paid)
    incr('hand', -paid)
  end
end
pay_debt()

local quiet_before, away_before = tonumber(ARGV[6]), tonumber(ARGV[10])
local admitted, from_tray = {}, 0
if admitting() then
  while true do
    if n('hand') == 0 then
      local moved = n('tray')
      if moved > 0 then
        incr('tray', -moved)
        incr('hand', moved)
        from_tray = from_tray + moved
      end
      pay_debt()
      if n('hand') == 0 then break end
    end
    if not queued() or not take_slot() then break end
    local id = pop_and_admit(quiet_before, away_before)
    if not id then break end
    incr('hand', -1)
    admitted[#admitted + 1] = id
  end
  if MODE_ADMITS_EVERYONE[mode()] then
    for _, id in ipairs(admit_everyone(quiet_before, away_before)) do admitted[#admitted + 1] = id end
  end
end

-- Mark quiet waiting (and away) tickets abandoned, a bounded slice per tick.
local abandoned = 0
local quiet = redis.call('ZRANGEBYSCORE', K('seen'), '-inf', '(' .. ARGV[6],
  'LIMIT', 0, SWEEP_BUDGET)
for _, sid in ipairs(quiet) do
  local t = load_ticket(sid)
  if t and (t.state == WAITING or t.state == AWAY) then
    left_waiting(t, ABANDONED)
    abandoned = abandoned + 1
  else
    redis.call('ZREM', K('seen'), sid)
  end
end

-- What the admission rate is taken over: admissions since the last tick.
local total = n('c_admissions')
local prev_total, prev_at = n('adm_at_last_tick'), n('last_tick_ms')
redis.call('HSET', META, 'adm_at_last_tick', S(total), 'last_tick_ms', S(NOW))
changed()
return reply({r = 'ok', tick_ms = n('tick_ms'), from_tray = from_tray, abandoned = abandoned,
  admitted = admitted, expired = expired, total = total, prev_total = prev_total,
  prev_at = prev_at, view = view_fields()})
