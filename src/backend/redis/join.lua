-- join: ARGV[3] = identity (hex) or ''. Idempotent per identity.
-- Returns {'ok', id, is_new, epoch, status...} | {'noroom'} | {'closed'} | {'full'}
local fields = {'closed', 'qtail'}
for _, f in ipairs(STATUS_FIELDS) do fields[#fields + 1] = f end
if not room(fields) then return {'noroom'} end
if M['closed'] == '1' then return {'closed'} end
local identity = ARGV[3]
if identity ~= '' then
  local existing = redis.call('HGET', K('ids'), identity)
  if existing then
    local t = load_ticket(existing)
    local reply = {'ok', t.id, 0, EPOCH}
    for _, v in ipairs(status_reply(t)) do reply[#reply + 1] = v end
    return reply
  end
end
if n('issued') >= MAX_TICKETS - 4096 then return {'full'} end
local id = incr('issued', 1) - 1
incr('waiting', 1)
incr('c_joins', 1)
local t = {id = id, state = 0, qi = -1, joined = NOW, admat = 0, seen = NOW, arrived = 0,
  reported = 4294967295, init = 0}
if M['open'] == '1' then
  enqueue(t)
else
  redis.call('RPUSH', K('pre'), S(id))
  save_ticket(t)
end
if identity ~= '' then redis.call('HSET', K('ids'), identity, S(id)) end
local reply = {'ok', id, 1, EPOCH}
for _, v in ipairs(status_reply(t)) do reply[#reply + 1] = v end
return reply
