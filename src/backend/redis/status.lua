-- status: ARGV[3] = ticket epoch, ARGV[4] = ticket id, ARGV[5] = '1' to
-- count as activity (on an admitted ticket, its arrival).
-- Returns {'ok', status...} | {'noroom'} | {'noticket'}
if not room(STATUS_FIELDS) then return {'noroom'} end
local t = ticket_of(ARGV[3], ARGV[4])
if not t then return {'noticket'} end
if ARGV[5] == '1' and (t.state == 0 or t.state == 1) then
  if NOW > t.seen then t.seen = NOW end
  if t.state == 1 then
    t.arrived = 1
    redis.call('ZADD', K('adm'), deadline(t), S(t.id))
  elseif t.qi >= 0 then
    redis.call('ZADD', K('seen'), 'XX', t.seen, S(t.id))
  end
  save_ticket(t)
end
local reply = {'ok'}
for _, v in ipairs(status_reply(t)) do reply[#reply + 1] = v end
return reply
