-- publish a room view built by the Rust side from a script's `view`
-- fields. ARGV[3] = the worker's lease token ('' for an unfenced call);
-- ARGV[4] = the change (`chg`) the view reflects; ARGV[5] = '1' to publish
-- even if nothing visible changed; ARGV[6] = the view's visible part
-- (rules::Visible), compared with the last one published; ARGV[7] = the
-- view as JSON; ARGV[8..10] = the smoothed admission rate (mean, variance,
-- primed) the worker computed, or '' to leave it.
-- A published view is a 'v' entry of the room's change log: '<version>
-- <json>'.
-- Returns {r = 'published', version} | {r = 'same'} | {r = 'superseded'}
--       | {r = 'notowner'} | {r = 'noroom'}
if ARGV[3] ~= '' and redis.call('GET', P .. 'lease') ~= ARGV[3] then
  return reply({r = 'notowner'})
end
if not room({'published_chg', 'view_sig', 'view_version'}) then return reply({r = 'noroom'}) end
if ARGV[8] ~= '' then
  redis.call('HSET', META, 'rate_mean', ARGV[8], 'rate_var', ARGV[9], 'rate_primed', ARGV[10])
end
local chg = tonumber(ARGV[4])
if chg < n('published_chg') then return reply({r = 'superseded'}) end
set('published_chg', ARGV[4])
if ARGV[5] ~= '1' and ARGV[6] == M['view_sig'] then return reply({r = 'same'}) end
local version = incr('view_version', 1)
redis.call('HSET', META, 'view_sig', ARGV[6], 'view', ARGV[7])
append_log('v', S(version) .. ' ' .. ARGV[7])
return reply({r = 'published', version = version})
