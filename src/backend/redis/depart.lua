-- leave / release / revoke: ARGV[3] = ticket epoch, ARGV[4] = ticket id,
-- ARGV[5] = 'leave' | 'release' | 'revoke'. Every state change is checked
-- and made inside this one script, so a late release of a revoked or
-- expired permit finds it gone and frees nothing.
-- Returns {'left'} | {'gave', 'to', id} | {'gave', 'tray'} | {'gave', 'retired'}
--       | {'nothing', state} | {'noroom'} | {'noticket'}
if not room({'issued', 'open', 'paused', 'debt', 'admit_cap', 'queue_idle_ms',
    'pass_idle_ms', 'arrival_grace_ms', 'peak'}) then return {'noroom'} end
local t = ticket_of(ARGV[3], ARGV[4])
if not t then return {'noticket'} end
local mode = ARGV[5]
if t.state == 1 then
  local to, counter = 2, 'c_releases'
  if mode == 'revoke' then to, counter = 3, 'c_revocations' end
  t.state = to
  save_ticket(t)
  redis.call('ZREM', K('adm'), S(t.id))
  incr('admitted', -1)
  incr(counter, 1)
  notify(t.id)
  local kind, next_id = give_back()
  if kind == 'to' then return {'gave', 'to', next_id} end
  return {'gave', kind}
end
if t.state == 0 and mode ~= 'release' then
  local to = 5
  if mode == 'revoke' then to = 3 end
  left_waiting(t, to)
  return {'left'}
end
return {'nothing', t.state}
