-- leave / release / revoke: ARGV[3] = ticket epoch, ARGV[4] = ticket id,
-- ARGV[5] = 'leave' | 'release' | 'revoke', ARGV[6] = the quiet cutoff for
-- a hand-off (rules::quiet_cutoff), ARGV[7] = the queue_idle it was
-- computed with, ARGV[8] = the away cutoff (rules::away_cutoff), ARGV[9] =
-- the away_grace it was computed with. Every state change is checked and made inside this one
-- script, so a late release of a revoked or expired permit finds it gone
-- and frees nothing.
-- Returns {r = 'left'} | {r = 'gave', to = id | tray = true | retired = true}
--       | {r = 'nothing', s = state} | {r = 'noticket'} | {r = 'noroom'} | {r = 'stale', ...}
if not room({'issued', 'open', 'paused', 'mode', 'debt', 'cap_interval_us', 'cap_tolerance_us',
    'tat_us', 'queue_idle_ms', 'away_grace_ms', 'peak'}) then return reply({r = 'noroom'}) end
local again = stale(ARGV[7], nil, nil, ARGV[9])
if again then return again end
if ARGV[3] ~= EPOCH or tonumber(ARGV[4]) >= n('issued') then return reply({r = 'noticket'}) end
local t = load_ticket(ARGV[4])
if not t then return reply({r = 'noticket'}) end
local mode = ARGV[5]
if t.state == ADMITTED then
  local to = RELEASED
  if mode == 'revoke' then to = REVOKED end
  t.state = to
  save_ticket(t)
  redis.call('ZREM', K('adm'), S(t.id))
  redis.call('ZREM', K('pas'), S(t.id))
  incr('admitted', -1)
  lane_incr('la', t.lane, -1)
  incr(ENDED_COUNTER[to], 1)
  log_end(t)
  local kind, next_id = give_back(tonumber(ARGV[6]), tonumber(ARGV[8]))
  if kind == 'to' then return reply({r = 'gave', to = next_id}) end
  if kind == 'tray' then return reply({r = 'gave', tray = true}) end
  return reply({r = 'gave', retired = true})
end
if (t.state == WAITING or t.state == AWAY) and mode ~= 'release' then
  local to = LEFT
  if mode == 'revoke' then to = REVOKED end
  left_waiting(t, to)
  return reply({r = 'left'})
end
return reply({r = 'nothing', s = t.state})
