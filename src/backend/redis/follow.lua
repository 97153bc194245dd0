-- follow: a follower of the room's change log says how far it has read,
-- and the log is trimmed behind the slowest live follower. ARGV[3] = the
-- follower's name (instance id), ARGV[4] = the last entry id it applied,
-- ARGV[5] = the time before which a follower's mark is stale (it died or
-- lost its connection; it reloads a snapshot if it comes back).
-- Returns {r = 'ok', trimmed = entries removed}
local marks = P .. 'followers'
redis.call('HSET', marks, ARGV[3], ARGV[4] .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', marks)
local slowest = nil
for i = 1, #all, 2 do
  local id, at = string.match(all[i + 1], '^(%S+) (%d+)$')
  if not id or tonumber(at) < tonumber(ARGV[5]) then
    redis.call('HDEL', marks, all[i])
  else
    local ms, sq = string.match(id, '^(%d+)-(%d+)$')
    local key = {tonumber(ms), tonumber(sq)}
    if not slowest or key[1] < slowest[1] or (key[1] == slowest[1] and key[2] < slowest[2]) then
      slowest = key
    end
  end
end
local trimmed = 0
if slowest then
  -- MINID keeps the slowest follower's last entry and everything after it.
  trimmed = redis.call('XTRIM', LOG, 'MINID', '~', S(slowest[1]) .. '-' .. S(slowest[2]))
end
return reply({r = 'ok', trimmed = trimmed})
