-- create or replace a room: ARGV[3] = '1' to replace an existing room
-- ('0' keeps it: every instance creates the configured rooms at start),
-- ARGV[4] = the new epoch, ARGV[5..] = settings (see RedisBackend::create),
-- ARGV[17] = the access rules (JSON, read only by Rust).
-- A replaced incarnation's keys are unlinked; its tickets, which name the
-- old epoch, become unknown.
-- Returns {'created', epoch} | {'exists', epoch}
local old = redis.call('HGET', META, 'epoch')
if old and ARGV[3] ~= '1' then return {'exists', old} end
if old then
  for _, name in ipairs({'tk', 'q', 'pre', 'ids', 'adm', 'seen', 'draw'}) do
    redis.call('UNLINK', P .. old .. ':' .. name)
  end
  redis.call('DEL', META)
end
EPOCH = ARGV[4]
local opens_at = ARGV[12]
local open = '1'
if opens_at ~= '' and tonumber(opens_at) > NOW then open = '0' end
local seed, commitment = '', ''
if open == '0' then seed, commitment = ARGV[15], ARGV[16] end
redis.call('HSET', META, 'epoch', EPOCH, 'capacity', ARGV[5], 'tick_ms', ARGV[6],
  'pass_idle_ms', ARGV[7], 'arrival_grace_ms', ARGV[8], 'queue_idle_ms', ARGV[9],
  'join_limit', ARGV[10], 'admit_cap', ARGV[11], 'opens_at', opens_at, 'order', ARGV[13],
  'paused', ARGV[14], 'access', ARGV[17], 'seed', seed, 'commitment', commitment, 'open', open, 'closed', '0',
  'hand', ARGV[5], 'tray', '0', 'debt', '0', 'admitted', '0', 'waiting', '0', 'issued', '0',
  'qtail', '0', 'peak', '0', 'last_tick_ms', S(NOW), 'adm_at_last_tick', '0',
  'rate_mean', '0', 'rate_var', '0', 'rate_primed', '0', 'view_version', '0')
publish_view(true)
redis.call('PUBLISH', CHANNEL, 'r|' .. ROOM .. '|' .. EPOCH .. '|')
return {'created', EPOCH}
