-- tick: one turn of the room's worker. ARGV[3] = the worker's lease owner
-- token, checked against `lease` so that a worker that lost its lease
-- (paused past expiry) cannot admit beside the new one; '' skips the
-- check (an operator's or a test's tick).
-- Returns {'notowner'} | {'open_needed'} | {'noroom'}
--       | {'ok', tick_ms, from_tray, abandoned, #admitted, ids..., #expired, ids...}
if ARGV[3] ~= '' and redis.call('GET', P .. 'lease') ~= ARGV[3] then
  return {'notowner'}
end
if not room({'closed', 'open', 'opens_at', 'paused', 'hand', 'tray', 'debt', 'admit_cap',
    'queue_idle_ms', 'pass_idle_ms', 'arrival_grace_ms', 'tick_ms', 'peak', 'c_admissions',
    'rate_mean', 'rate_var', 'rate_primed', 'last_tick_ms', 'adm_at_last_tick'}) then
  return {'noroom'}
end
if M['closed'] == '1' then return {'ok', n('tick_ms'), 0, 0, 0, 0} end
if M['open'] ~= '1' and M['opens_at'] and M['opens_at'] ~= ''
    and tonumber(M['opens_at']) <= NOW then
  return {'open_needed'}
end

-- Take back stalled permits.
local expired = {}
local due = redis.call('ZRANGEBYSCORE', K('adm'), '-inf', '(' .. S(NOW))
for _, sid in ipairs(due) do
  local t = load_ticket(sid)
  if not t or t.state ~= 1 then
    redis.call('ZREM', K('adm'), sid)
  else
    local d = deadline(t)
    if d >= NOW then
      redis.call('ZADD', K('adm'), d, sid)
    else
      t.state = 4
      save_ticket(t)
      redis.call('ZREM', K('adm'), sid)
      incr('admitted', -1)
      incr('c_expirations', 1)
      incr('hand', 1)
      expired[#expired + 1] = t.id
      notify(t.id)
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

local admitted, from_tray = {}, 0
if M['open'] == '1' and M['paused'] ~= '1' then
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
    if redis.call('ZCARD', K('q')) == 0 or not try_take() then break end
    local id = pop_and_admit()
    if not id then break end
    incr('hand', -1)
    admitted[#admitted + 1] = id
  end
end

-- Mark quiet waiting tickets abandoned, a bounded slice per tick.
local abandoned = 0
local idle = n('queue_idle_ms')
local quiet = redis.call('ZRANGEBYSCORE', K('seen'), '-inf', '(' .. S(NOW - idle),
  'LIMIT', 0, 10000)
for _, sid in ipairs(quiet) do
  local t = load_ticket(sid)
  if t and t.state == 0 and t.seen + idle < NOW then
    left_waiting(t, 6)
    abandoned = abandoned + 1
  else
    redis.call('ZREM', K('seen'), sid)
  end
end

-- The admission rate, as engine::rate::AdmissionRate::observe.
local total = n('c_admissions')
if M['open'] == '1' and M['paused'] ~= '1' then
  local elapsed = NOW - n('last_tick_ms')
  if elapsed > 0 then
    local secs = elapsed / 1000
    local sample = (total - n('adm_at_last_tick')) / secs
    local mean, var = sample, 0
    if M['rate_primed'] == '1' then
      local alpha = 1 - math.exp(-secs / 30)
      local delta = sample - tonumber(M['rate_mean'])
      mean = tonumber(M['rate_mean']) + alpha * delta
      var = (1 - alpha) * (tonumber(M['rate_var']) + alpha * delta * delta)
    end
    redis.call('HSET', META, 'rate_mean', string.format('%.17g', mean),
      'rate_var', string.format('%.17g', var), 'rate_primed', '1')
  end
end
redis.call('HSET', META, 'adm_at_last_tick', S(total), 'last_tick_ms', S(NOW))
publish_view(false)

local reply = {'ok', n('tick_ms'), from_tray, abandoned, #admitted}
for _, id in ipairs(admitted) do reply[#reply + 1] = id end
reply[#reply + 1] = #expired
for _, id in ipairs(expired) do reply[#reply + 1] = id end
return reply
