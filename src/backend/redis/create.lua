-- create or replace a room: ARGV[3] = '1' to replace an existing room
-- ('0' keeps it: every instance creates the configured rooms at start),
-- ARGV[4] = the new epoch, ARGV[5] = the settings as JSON (named as the
-- meta fields; see RedisBackend::create; `access` holds the access rules'
-- fields, read only by Rust; `lanes` the priority lanes as [{name,
-- weight}] and `lane_def` the default lane's index). A replaced incarnation's keys are unlinked;
-- its tickets, which name the old epoch, become unknown. The change log is
-- the room's, not the incarnation's: it goes on, with an 'n' entry naming
-- the new epoch.
-- Returns {r = 'created', view = {...}} | {r = 'exists', epoch}
local old = redis.call('HGET', META, 'epoch')
if old and ARGV[3] ~= '1' then return reply({r = 'exists', epoch = old}) end
if old then
  for _, name in ipairs({'tk', 'q', 'pre', 'ids', 'seen', 'adm', 'pas', 'draw', 'dep', 'back',
      'away', 'ln'}) do
    redis.call('UNLINK', P .. old .. ':' .. name)
  end
  for l = 1, (tonumber(redis.call('HGET', META, 'lanes')) or 0) - 1 do
    for _, name in ipairs({'q', 'dep', 'back', 'away'}) do
      redis.call('UNLINK', P .. old .. ':' .. name .. ':' .. l)
    end
  end
  redis.call('DEL', META)
end
EPOCH = ARGV[4]
local s = cjson.decode(ARGV[5])
local open = '1'
if s.opens_at ~= '' and tonumber(s.opens_at) > NOW then open = '0' end
local seed, commitment = '', ''
if open == '0' then seed, commitment = s.seed, s.commitment end
redis.call('HSET', META, 'epoch', EPOCH, 'capacity', s.capacity, 'tick_ms', s.tick_ms,
  'pass_idle_ms', s.pass_idle_ms, 'arrival_grace_ms', s.arrival_grace_ms,
  'queue_idle_ms', s.queue_idle_ms, 'away_grace_ms', s.away_grace_ms, 'join_limit', s.join_limit, 'admit_cap', s.admit_cap,
  'cap_interval_us', s.cap_interval_us, 'cap_tolerance_us', s.cap_tolerance_us, 'tat_us', '0',
  'opens_at', s.opens_at, 'order', s.order, 'paused', s.paused, 'mode', s.mode,
  'stock', s.stock, 'seed', seed,
  'commitment', commitment, 'open', open, 'closed', '0', 'hand', s.capacity, 'tray', '0',
  'debt', '0', 'admitted', '0', 'waiting', '0', 'issued', '0', 'peak', '0',
  'last_tick_ms', S(NOW), 'adm_at_last_tick', '0', 'rate_mean', '0', 'rate_var', '0',
  'rate_primed', '0', 'view_version', '0', 'chg', '0', 'published_chg', '0',
  'templates_dir', s.templates_dir)
for field, value in pairs(s.access) do redis.call('HSET', META, field, value) end
if #s.lanes > 0 then
  LANES, LANED = #s.lanes, true
  redis.call('HSET', META, 'lanes', S(#s.lanes), 'lane_def', S(s.lane_def))
  for i, lane in ipairs(s.lanes) do
    local l = i - 1
    redis.call('HSET', META, 'lane_n' .. l, lane.name, 'lane_w' .. l, S(lane.weight),
      'lq' .. l, '0', 'la' .. l, '0', 'lw' .. l, '0')
  end
end
-- Followers of the room's log start the new incarnation from here.
append_log('n', EPOCH)
redis.call('PUBLISH', CHANNEL, 'r|' .. ROOM .. '|' .. EPOCH .. '|')
return reply({r = 'created', view = view_fields()})
