-- Take a free lease with a fencing token higher than any before it, and
-- mark the room's log with it. Each owner's entries carry its token as
-- the first part of their stream ids (XADD <token>-*), and the mark comes
-- first, so an earlier owner's late append, numbered lower, is refused by
-- XADD itself. The token is at least Redis's clock in ms and above the
-- log's last id: a Redis that lost the counter (or everything) still hands
-- out tokens above those of owners from before the loss.
-- KEYS[1] = the lease, KEYS[2] = the fence, KEYS[3] = the log; ARGV[1] =
-- the holder, ARGV[2] = the lease in ms. Answers {token, lease value}, or
-- {0, holder}.
local holder = redis.call('GET', KEYS[1])
if holder then return {0, holder} end
local now = redis.call('TIME')
local token = math.max(redis.call('INCR', KEYS[2]), tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
if redis.call('EXISTS', KEYS[3]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      token = math.max(token, tonumber(string.match(info[i + 1], '^(%d+)')) + 1)
    end
  end
end
redis.call('SET', KEYS[2], token)
local value = ARGV[1] .. '/' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
redis.call('XADD', KEYS[3], token .. '-0', 'o', value)
return {token, value}
