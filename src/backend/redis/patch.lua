-- patch a running room: ARGV[3] = capacity or '', ARGV[4] = paused '0'/'1'
-- or '', ARGV[5] = '1' when timeouts follow in ARGV[6..11] (tick_ms,
-- pass_idle_ms, arrival_grace_ms, queue_idle_ms, join_limit, admit_cap) and
-- ARGV[12] (the access rules, JSON).
-- Capacity changes follow Room::set_capacity: raising cancels debt, then
-- adds to the worker's hand; lowering takes from the hand, then the tray,
-- and the rest becomes debt that finishers pay instead of handing off.
-- Returns {'ok'} | {'noroom'} | {'closed'}
if not room({'closed', 'capacity', 'hand', 'tray', 'debt'}) then return {'noroom'} end
if M['closed'] == '1' then return {'closed'} end
if ARGV[5] == '1' then
  redis.call('HSET', META, 'tick_ms', ARGV[6], 'pass_idle_ms', ARGV[7],
    'arrival_grace_ms', ARGV[8], 'queue_idle_ms', ARGV[9], 'join_limit', ARGV[10],
    'admit_cap', ARGV[11], 'access', ARGV[12])
  load_meta({'pass_idle_ms', 'arrival_grace_ms'})
  -- Deadlines of admitted tickets follow the new timeouts.
  local ids = redis.call('ZRANGE', K('adm'), 0, -1)
  for _, sid in ipairs(ids) do
    local t = load_ticket(sid)
    if t and t.state == 1 then redis.call('ZADD', K('adm'), deadline(t), sid) end
  end
end
if ARGV[3] ~= '' then
  local new, old = tonumber(ARGV[3]), n('capacity')
  set('capacity', ARGV[3])
  if new >= old then
    local more = new - old
    local cancel = math.min(n('debt'), more)
    if cancel > 0 then incr('debt', -cancel) end
    if more - cancel > 0 then incr('hand', more - cancel) end
  else
    local less = old - new
    local from_hand = math.min(less, n('hand'))
    if from_hand > 0 then incr('hand', -from_hand) end
    less = less - from_hand
    local from_tray = math.min(less, n('tray'))
    if from_tray > 0 then incr('tray', -from_tray) end
    less = less - from_tray
    if less > 0 then incr('debt', less) end
  end
end
if ARGV[4] ~= '' then set('paused', ARGV[4]) end
publish_view(false)
return {'ok'}
