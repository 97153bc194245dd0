-- Take a free lease with a fencing token higher than any before it.
-- KEYS[1] = the room's lease, KEYS[2] = its fence; ARGV[1] = the holder,
-- ARGV[2] = the lease in ms. Answers {token, lease value}, or {0, holder}.
local holder = redis.call('GET', KEYS[1])
if holder then return {0, holder} end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '/' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {token, value}
